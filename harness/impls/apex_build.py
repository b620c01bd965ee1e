"""Build apex's optimized SyncBatchNorm extension (``syncbn``) from a checkout the user supplies.

apex is not on the package index and users build it from source. Its
``apex.parallel`` package (removed by NVIDIA/apex PR #1896) exposes the
optimized ``SyncBatchNorm`` when a CUDA extension named ``syncbn`` imports,
else its Python fallback. Users get ``syncbn`` by building apex with
``--cuda_ext``, which compiles every extension apex has (tens of minutes);
this builds that one extension only, from the same two sources
(``csrc/syncbn.cpp``, ``csrc/welford.cu``) with the flags apex's ``setup.py``
gives it (``-O3`` and the ``VERSION_GE_1_1``/``1_3``/``1_5`` macros every
torch since 1.5 gets), for the GPU present.

Protocol: :func:`build_syncbn` returns a folder holding ``syncbn*.so``; with
that folder and the checkout on ``PYTHONPATH``, ``import apex.parallel``
takes its optimized path exactly as an installed apex with ``--cuda_ext``
would. The folder is cached under the harness cache (kind ``apex``), keyed by
the torch build, the architectures and the sources' bytes, so a second call
loads instead of compiling. Nothing of apex ships with the harness: the
checkout is the user's.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from harness.errors import KernelBuildError, UsageError
from harness.paths import cache_folder

SOURCES = ("csrc/syncbn.cpp", "csrc/welford.cu")
HEADERS = ("csrc/type_shim.h", "csrc/compat.h")
FLAGS = ["-O3", "-DVERSION_GE_1_1", "-DVERSION_GE_1_3", "-DVERSION_GE_1_5"]
CACHE_KIND = "apex"


def check_checkout(src: Path) -> None:
    """A usage error naming what is missing unless ``src`` is an apex checkout that still has apex.parallel."""
    if not (src / "apex" / "__init__.py").is_file():
        raise UsageError(f"--apex-src {src}: not an apex checkout (no apex/__init__.py there); clone "
                         "https://github.com/NVIDIA/apex and check out a commit before PR #1896, e.g. e13873de")
    if not (src / "apex" / "parallel" / "__init__.py").is_file():
        raise UsageError(f"--apex-src {src}: this apex has no apex.parallel (removed by NVIDIA/apex PR #1896); "
                         "check out a commit before it, e.g. e13873de")
    missing = [p for p in SOURCES + HEADERS if not (src / p).is_file()]
    if missing:
        raise UsageError(f"--apex-src {src}: the syncbn sources are missing ({', '.join(missing)}); use a whole "
                         "checkout of a commit before NVIDIA/apex PR #1896")


def build_dir(src: Path, archs: str) -> Path:
    """The cache folder for this checkout's syncbn built for ``archs`` with this torch build."""
    import torch

    h = hashlib.sha256()
    for part in (torch.__version__, str(torch.version.git_version), str(torch.version.cuda), archs, *FLAGS):
        h.update(part.encode() + b"\0")
    for rel in SOURCES + HEADERS:
        h.update((src / rel).read_bytes())
    return cache_folder(CACHE_KIND) / h.hexdigest()[:16]


def fallback_includes() -> list[str]:
    """``-isystem`` flags for the CUDA headers pip's ``nvidia-*`` packages ship, searched after the toolkit's.

    apex's sources include ``ATen/cuda/CUDAContext.h``, which includes ``cusparse.h`` and ``cublas_v2.h``; a
    toolkit installed without those libraries (only nvcc and the runtime) lacks them, while the CUDA torch build
    brings them as wheels. The toolkit's own headers still win where it has them.
    """
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    flags = []
    for root in (spec.submodule_search_locations if spec else None) or []:
        for inc in sorted(Path(root).glob("*/include")):
            flags += ["-isystem", str(inc)]
    return flags


def build_syncbn(src: Path, archs: str, *, verbose: bool = False) -> Path:
    """Build (or find built) apex's ``syncbn`` for ``archs`` (e.g. "9.0"); the folder holding it."""
    from filelock import FileLock

    from harness.kernels.extension import find_cuda_home

    src = Path(src).resolve()
    check_checkout(src)
    out = build_dir(src, archs)
    out.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out) + ".lock", timeout=1800):
        if any(out.glob("syncbn*.so")):
            return out
        cuda_home = find_cuda_home()
        if cuda_home is None:
            raise KernelBuildError("building apex's syncbn needs nvcc: set CUDA_HOME to the CUDA toolkit's folder "
                                   "or put its bin/ on PATH")
        # A child process, so that a build that fails or is stopped leaves this one clean (cpp_extension
        # imports the module it builds; here nothing should be imported).
        code = (
            "import sys, torch.utils.cpp_extension as c\n"
            "c.load(name='syncbn', sources=sys.argv[2:4], build_directory=sys.argv[1], extra_cflags=sys.argv[4:],\n"
            "       extra_cuda_cflags=sys.argv[4:], with_cuda=True, is_python_module=False, verbose=True)\n"
        )
        env = {**os.environ, "CUDA_HOME": str(cuda_home), "TORCH_CUDA_ARCH_LIST": archs}
        env.setdefault("MAX_JOBS", str(os.cpu_count() or 1))
        argv = [sys.executable, "-c", code, str(out), *(str(src / s) for s in SOURCES), *FLAGS,
                *fallback_includes()]
        proc = subprocess.run(argv, env=env, capture_output=not verbose, text=True, timeout=1800)
        if proc.returncode != 0 or not any(out.glob("syncbn*.so")):
            tail = "\n".join(((proc.stdout or "") + (proc.stderr or "")).strip().splitlines()[-25:])
            raise KernelBuildError(f"building apex's syncbn from {src} failed (exit {proc.returncode}) in {out}:\n"
                                   f"{tail}\nfix: a CUDA toolkit matching torch.version.cuda, and an apex commit "
                                   "before NVIDIA/apex PR #1896")
    return out


def pythonpath(src: Path, built: Path) -> str:
    """``PYTHONPATH`` entries that make ``import apex.parallel`` find this checkout and its built ``syncbn``."""
    return os.pathsep.join([str(Path(src).resolve()), str(built)])
