"""Build and load the reference extension whose sources sit beside this module.

Protocol:
- :func:`load` makes ``torch.ops.syncbn_ref`` available in this process. It
  builds on first use and loads the cached shared library afterwards.
- The cache directory is keyed by everything that makes a binary valid: torch
  version, torch git commit, CUDA version, whether CUDA sources are included
  (and for which architectures), the compiler flags and a hash of the sources.
  A different torch build never loads a stale binary.
- A file lock per key serializes builders, so parallel workers (ranks,
  pytest-xdist) build once; the others wait and then load. The builder that
  holds it removes the lock file torch's own builder leaves behind when killed
  mid-build (torch would wait for it forever).
- Failures raise :class:`KernelBuildError` naming the cause and the fix.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.errors import KernelBuildError
from harness.paths import PORTABLE, cache_folder, setting

log = logging.getLogger(__name__)

def _cpu_flags() -> set[str]:
    """Feature flags of this machine's CPU from /proc/cpuinfo (empty where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


# ISA flag sets, best first: (features /proc/cpuinfo must list, compiler flags). The kernels vectorize
# float64 lanes and convert half with F16C; AVX-512 doubles the float64 lanes per instruction.
_ISA_LEVELS = [
    ({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl"},
     ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl"]),
    ({"avx2", "fma", "f16c"}, ["-mavx2", "-mfma", "-mf16c"]),
]


def isa_cflags(cpu_flags: set[str] | None = None) -> list[str]:
    """The best ISA flags this CPU supports (x86-64 only), else none: portable code.

    The extension is JIT-built on the machine that runs it, and the flags are part of the
    cache key, so a binary built for one CPU is never loaded on a CPU that lacks its ISA.
    ``SYNCBN_HARNESS_PORTABLE=1`` forces the portable build.
    """
    import platform

    if setting(PORTABLE) == "1":
        return []
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return []
    have = _cpu_flags() if cpu_flags is None else cpu_flags
    for needs, flags in _ISA_LEVELS:
        if needs <= have:
            return list(flags)
    return []


def openmp_cflags() -> list[str]:
    """``-fopenmp`` when torch's intra-op threads are OpenMP and the compiler is GCC, else none.

    ``at::parallel_for`` is a header template: built without ``-fopenmp`` its ``#pragma omp parallel`` is
    ignored and every kernel runs on one thread. Compiled (not linked) with it, GCC's ``GOMP_*`` calls
    resolve to the libgomp torch has loaded: one thread pool, sized by ``torch.set_num_threads``. Clang's
    ``-fopenmp`` targets another runtime, so only GCC gets the flag. Decided from torch's ATen/Config.h
    and the compiler's path, without importing torch or running anything.
    """
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations or not sys.platform.startswith("linux"):
        return []
    config = Path(list(spec.submodule_search_locations)[0]) / "include" / "ATen" / "Config.h"
    try:
        if "#define AT_PARALLEL_OPENMP 1" not in config.read_text(errors="replace"):
            return []
    except OSError:
        return []
    cxx = shutil.which(os.environ.get("CXX", "c++"))
    name = Path(os.path.realpath(cxx)).name if cxx else ""
    return ["-fopenmp"] if ("g++" in name or "gcc" in name) and "clang" not in name else []


EXT_CUDA_CFLAGS = ["-O3"]
DEFAULT_CUDA_ARCHS = "8.0;9.0"
LOCK_TIMEOUT_S = 1800  # a CUDA build on two cores takes minutes, never half an hour

_loaded: dict[str, Path] = {}  # cache key -> the library this process loaded
_default: list[Path] = []  # the library load() loaded, so later calls cost nothing


@functools.lru_cache(maxsize=1)
def host_cflags() -> tuple[str, ...]:
    """Host compiler flags (asked once per process, on first build or load, never at import).

    ``-O3``, this CPU's ISA flags, OpenMP where torch uses it; and ``-std=c++17`` for torch < 2, which
    builds extensions as C++14 by default (newer releases pass C++17 or C++20 themselves).
    """
    import torch

    major = int(torch.__version__.split(".")[0])
    return tuple(["-O3"] + isa_cflags() + openmp_cflags() + (["-std=c++17"] if major < 2 else []))


def find_cuda_home() -> Path | None:
    """The CUDA toolkit's real folder: ``$CUDA_HOME``, else where ``nvcc`` really lives.

    ``nvcc`` on PATH may be a wrapper script outside the toolkit, so its folder
    is asked from nvcc itself (``--dryrun`` prints ``_HERE_``).
    """
    for var in ("CUDA_HOME", "CUDA_PATH"):
        value = os.environ.get(var)
        if value and (Path(value) / "bin" / "nvcc").exists():
            return Path(value)
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    try:
        out = subprocess.run(
            [nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
            capture_output=True, text=True, timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in (out.stdout + out.stderr).splitlines():
        if line.startswith("#$ _HERE_="):
            return Path(line.split("=", 1)[1].strip()).resolve().parent
    return Path(nvcc).resolve().parent.parent


@dataclass(frozen=True)
class BuildSpec:
    """What one build of the extension is made of; ``key`` names its cache folder."""

    with_cuda: bool
    cuda_archs: str | None

    @property
    def sources(self) -> list[Path]:
        from harness import kernels

        srcs = list(kernels.SCHEMA_SOURCES) + list(kernels.CPU_SOURCES)
        if self.with_cuda:
            srcs += list(kernels.CUDA_SOURCES)
        return srcs

    @functools.cached_property
    def key(self) -> str:
        """A hash of everything that makes the binary valid (computed once per spec)."""
        import torch

        from harness import kernels

        h = hashlib.sha256()
        for part in (
            torch.__version__,
            str(torch.version.git_version),
            str(torch.version.cuda),
            f"cuda={self.with_cuda}:{self.cuda_archs}",
            # Host flags, ISA flags included: a build for another CPU's ISA is another binary.
            "cflags=" + " ".join(host_cflags()),
            "cuda_cflags=" + " ".join(EXT_CUDA_CFLAGS),
            sys.version.split()[0],
        ):
            h.update(part.encode() + b"\0")
        for path in sorted(set(self.sources) | set(kernels.HEADERS)):
            h.update(path.name.encode() + b"\0" + path.read_bytes())
        return h.hexdigest()[:16]

    @property
    def name(self) -> str:
        return f"syncbn_ref_{self.key}"

    @property
    def directory(self) -> Path:
        return cache_folder("kernels") / self.key

    @property
    def library(self) -> Path:
        return self.directory / f"{self.name}.so"


def default_spec(cuda: bool | None = None, cuda_archs: str | None = None) -> BuildSpec:
    """The build to use here: CUDA sources only when asked for or a GPU is present."""
    import torch

    if cuda is None:
        cuda = torch.cuda.is_available()
    if cuda and torch.version.cuda is None:
        raise KernelBuildError(
            f"CUDA kernels requested, but torch {torch.__version__} is a CPU-only build: "
            "install a CUDA build of torch, or build without --cuda"
        )
    archs = None
    if cuda:
        archs = cuda_archs or os.environ.get("TORCH_CUDA_ARCH_LIST") or (
            None if torch.cuda.is_available() else DEFAULT_CUDA_ARCHS
        )
    return BuildSpec(with_cuda=bool(cuda), cuda_archs=archs)


def state(spec: BuildSpec | None = None) -> str:
    """One line for ``env``: whether the extension for this build is cached."""
    spec = spec or default_spec()
    if spec.library.exists():
        return f"built ({spec.library})"
    return f"not built yet (builds on first use into {spec.directory})"


def _check_toolchain(spec: BuildSpec) -> None:
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        raise KernelBuildError(
            f"no C++ compiler: '{cxx}' is not on PATH; install one (Debian: apt-get install g++) "
            "or set CXX to a compiler"
        )
    try:
        import ninja  # noqa: F401
    except ImportError:
        if shutil.which("ninja") is None:
            raise KernelBuildError("ninja is missing: pip install ninja") from None
    if spec.with_cuda and find_cuda_home() is None:
        raise KernelBuildError(
            "CUDA kernels requested but no CUDA toolkit found: put nvcc on PATH or set CUDA_HOME "
            "to the toolkit folder"
        )


def build(spec: BuildSpec | None = None, *, verbose: bool = False) -> Path:
    """Build (if needed) and load the extension; return the shared library's path."""
    import torch

    spec = spec or default_spec()
    if spec.key in _loaded:
        return _loaded[spec.key]
    from filelock import FileLock, Timeout

    spec.directory.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(spec.directory) + ".lock")
    try:
        with lock.acquire(timeout=LOCK_TIMEOUT_S):
            if not spec.library.exists():
                _clear_stale_baton(spec)
                _compile(spec, verbose=verbose)
    except Timeout:
        raise KernelBuildError(
            f"waited {LOCK_TIMEOUT_S}s for another process building {spec.directory}; "
            f"if none is running, delete {lock.lock_file}"
        ) from None
    try:
        torch.ops.load_library(str(spec.library))
    except OSError as exc:
        raise KernelBuildError(
            f"built extension {spec.library} does not load ({exc}); delete {spec.directory} to rebuild"
        ) from exc
    _loaded[spec.key] = spec.library
    from harness.kernels.fake import register_fakes

    register_fakes()
    return spec.library


def _clear_stale_baton(spec: BuildSpec) -> None:
    """Remove the ``lock`` file torch's builder leaves in its build folder when it is killed mid-build (Ctrl-C, a
    timeout, a test's SIGKILL). torch waits for that file to go, without a timeout, so every later build of
    this key would hang. Called holding this key's file lock: no other builder of this harness is at work, so
    the file is stale."""
    baton = spec.directory / "lock"
    if baton.exists():
        log.warning("removing %s, left by a build of the reference kernels that was killed", baton)
        baton.unlink(missing_ok=True)


def _compile(spec: BuildSpec, *, verbose: bool) -> None:
    _check_toolchain(spec)
    import torch

    try:
        import torch.utils.cpp_extension as cpp
    except ImportError as exc:  # torch < 2.1 imports pkg_resources, which setuptools 81 removed
        raise KernelBuildError(f"torch {torch.__version__}'s torch.utils.cpp_extension does not import ({exc}); "
                               "install what it names (for pkg_resources: pip install 'setuptools<81')") from exc

    what = f"CPU and CUDA ({spec.cuda_archs or 'this GPU'})" if spec.with_cuda else "CPU"
    took = "a few minutes" if spec.with_cuda else "~30 s on two cores"
    note = (f"building the reference kernels ({what}) for torch {torch.__version__} "
            f"(once per build, {took}) into {spec.directory} ...")
    log.info(note)
    print(f"syncbn-harness: {note}", file=sys.stderr, flush=True)

    env_backup = {k: os.environ.get(k) for k in ("CUDA_HOME", "TORCH_CUDA_ARCH_LIST", "MAX_JOBS")}
    cuda_home_backup = cpp.CUDA_HOME
    try:
        if spec.with_cuda:
            cuda_home = str(find_cuda_home())
            os.environ["CUDA_HOME"] = cuda_home
            cpp.CUDA_HOME = cuda_home  # read at import time from PATH, which may hold a wrapper
            if spec.cuda_archs:
                os.environ["TORCH_CUDA_ARCH_LIST"] = spec.cuda_archs
        os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 1))
        cpp.load(
            name=spec.name,
            sources=[str(s) for s in spec.sources],
            extra_cflags=list(host_cflags()),
            extra_cuda_cflags=EXT_CUDA_CFLAGS if spec.with_cuda else None,
            build_directory=str(spec.directory),
            with_cuda=spec.with_cuda,
            is_python_module=False,
            verbose=verbose,
        )
    except (RuntimeError, subprocess.CalledProcessError, OSError) as exc:
        detail = str(exc).strip().splitlines()
        tail = "\n".join(detail[-25:])
        raise KernelBuildError(
            f"building the reference kernels failed in {spec.directory}:\n{tail}\n"
            "fix: check the compiler output above (run `syncbn-harness build-kernels --verbose` for all of it); "
            "a compiler or CUDA toolkit that does not match this torch build is the usual cause"
        ) from exc
    finally:
        cpp.CUDA_HOME = cuda_home_backup
        for k, v in env_backup.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if not spec.library.exists():
        raise KernelBuildError(f"the build finished but {spec.library} is missing; delete {spec.directory} and retry")


def load_if_built() -> Path | None:
    """Load the default build when it exists already (never compiles); its library, or None."""
    if _default:
        return _default[0]
    spec = default_spec()
    if not spec.library.exists():
        return None
    return load()


def load() -> Path:
    """Make ``torch.ops.syncbn_ref`` usable in this process (builds once per torch build); cheap after the first call.

    The first call finds the build for this torch (hashing the sources for the cache key), builds it if
    needed and loads it; every later call returns the library loaded then, without hashing anything.
    """
    if not _default:
        _default.append(build())
    return _default[0]
