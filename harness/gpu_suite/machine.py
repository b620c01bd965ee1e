"""The machine the GPU suite runs on, described once: GPUs, driver, torch, NCCL, CUDA, compiler, profiler, CPUs,
and the harness itself.

A :class:`Machine` (its GPUs :class:`Gpu`, the harness's commit
:class:`Provenance`) is written to ``machine.json`` as :func:`dataclasses.asdict`
gives it: the files of runs already filed keep their shape.
:func:`describe` reads torch (device count, names, compute capabilities,
memory, the NCCL it carries), ``nvidia-smi`` for the driver (absent where
there is no driver), ``nvcc --version`` for the toolkit that builds the
kernels, where Nsight Compute's ``ncu`` is, the interpreter, and which commit
of the harness runs (:func:`provenance`). It never fails: a part that cannot
be read is ``None``.
:meth:`Machine.cannot_run` says why the suite cannot run here (no GPU, no CUDA torch),
naming the fix, or ``None``.
"""

from __future__ import annotations

import glob
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional


@dataclass(frozen=True)
class Gpu:
    """One GPU as torch sees it."""

    name: str
    capability: str  # "9.0"
    memory_gib: float
    multiprocessors: int


@dataclass(frozen=True)
class Provenance:
    """Which commit of the harness runs, whether its tree was clean (None: unknown), and who said so."""

    commit: Optional[str]
    clean: Optional[bool]
    source: str


@dataclass(frozen=True)
class Machine:
    """What this machine has (a part that could not be read is None); its JSON is :meth:`to_json`."""

    gpus: tuple[Gpu, ...]
    driver: Optional[str]
    torch: str
    torch_git: Optional[str]
    torch_cuda: Optional[str]
    nvcc: Optional[str]
    cuda_home: Optional[str]
    python: str
    python_executable: str
    cpus: Optional[int]
    platform: str
    nccl: Optional[tuple[int, ...]]  # [major, minor, patch]
    ncu: Optional[str]
    harness: Provenance

    def to_json(self) -> dict:
        """JSON-safe data, as ``machine.json`` holds it."""
        return asdict(self)

    @property
    def archs(self) -> str:
        """The GPUs' architectures as ``TORCH_CUDA_ARCH_LIST`` takes them (``"9.0"``)."""
        return ";".join(sorted({g.capability for g in self.gpus}))

    def cannot_run(self) -> Optional[str]:
        """Why the GPU suite cannot run on this machine (naming the fix), or None."""
        if not self.torch_cuda:
            return (f"torch {self.torch} is a CPU-only build: run the suite with a Python whose torch is a CUDA "
                    "build (`python -c 'import torch; print(torch.version.cuda)'` prints a version)")
        if not self.gpus:
            return (f"torch {self.torch} (CUDA {self.torch_cuda}) sees no GPU: run the suite on a machine "
                    "with a GPU and its driver, with CUDA_VISIBLE_DEVICES unset or naming one")
        if not self.cuda_home:
            return ("no CUDA toolkit found to build the kernels: set CUDA_HOME to its folder (the one holding "
                    "bin/nvcc) or put nvcc on PATH")
        return None


def _output(argv: list[str]) -> Optional[str]:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


COMMIT_ENV = "SYNCBN_HARNESS_COMMIT"  # where the checkout travels without .git: the commit it was copied from
CLEAN_ENV = "SYNCBN_HARNESS_TREE_CLEAN"  # "1" when that copy had no uncommitted change, "0" otherwise
NCU_PLACES = ("/opt/nvidia/nsight-compute/*/ncu", "/usr/local/cuda*/bin/ncu", "/usr/local/cuda*/nsight-compute*/ncu")


def provenance(root: Optional[Path] = None) -> Provenance:
    """Which commit of the harness runs and whether its tree was clean: from :data:`COMMIT_ENV` and
    :data:`CLEAN_ENV` where the caller sets them, else from git where the checkout has its ``.git``, else unknown
    (``None``).

    The caller's word comes first: a copy sent to a lent machine may carry a ``.git`` that is not the tree's own
    (seen on 2026-11-28: the copy's git named the session's first commit and called every later commit an
    uncommitted change), while the caller knows the commit it copied.
    """
    commit = os.environ.get(COMMIT_ENV)
    if commit:
        clean = os.environ.get(CLEAN_ENV)
        return Provenance(commit, None if clean is None else clean == "1", f"${COMMIT_ENV}, ${CLEAN_ENV}")
    root = root or Path(__file__).resolve().parents[2]
    if (root / ".git").exists():
        commit = _output(["git", "-C", str(root), "rev-parse", "HEAD"])
        status = _output(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"])
        if commit:
            return Provenance(commit, status == "", "git")
    return Provenance(None, None, f"unknown: no .git here and no ${COMMIT_ENV}")


def find_ncu() -> Optional[str]:
    """Nsight Compute's command line tool: on PATH, or where CUDA images install it; None if absent."""
    found = shutil.which("ncu")
    if found:
        return found
    for pattern in NCU_PLACES:
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[-1]
    return None


def nccl_version() -> Optional[tuple[int, ...]]:
    """The NCCL version torch carries, as [major, minor, patch]; None without one."""
    import torch

    try:
        v = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - a CPU build has no NCCL: unknown, not an error
        return None
    if isinstance(v, int):  # old torch: one number, e.g. 2708
        return (v // 1000, v // 100 % 10, v % 100)
    return tuple(v)[:3]


def describe() -> Machine:
    """What this machine has."""
    import torch

    from harness.kernels.extension import find_cuda_home

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    gpus = []
    for i in range(n):
        p = torch.cuda.get_device_properties(i)
        gpus.append(Gpu(p.name, f"{p.major}.{p.minor}", round(p.total_memory / 2**30, 1), p.multi_processor_count))
    smi = _output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]) if shutil.which(
        "nvidia-smi") else None
    cuda_home = find_cuda_home()
    nvcc = _output([str(cuda_home / "bin" / "nvcc"), "--version"]) if cuda_home else None
    return Machine(
        gpus=tuple(gpus),
        driver=smi.splitlines()[0].strip() if smi else None,
        torch=torch.__version__,
        torch_git=torch.version.git_version,
        torch_cuda=torch.version.cuda,
        nvcc=nvcc.splitlines()[-1].strip() if nvcc else None,
        cuda_home=str(cuda_home) if cuda_home else None,
        python=sys.version.split()[0],
        python_executable=sys.executable,
        cpus=os.cpu_count(),
        platform=platform.platform(),
        nccl=nccl_version() if torch.version.cuda else None,
        ncu=find_ncu(),
        harness=provenance(),
    )
