"""The build under test: torch version and commit, CUDA, backends, apex state, host; what ``env`` prints.

Everything here is read from the installed packages at run time; records and
store keys are made from :func:`build_info`.

A Python overlay (a torch tree whose Python files are another commit's, laid
over an installed binary by the bisection) carries :data:`OVERLAY_MARKER`
beside its ``torch`` package: ``{"commit": ..., "binary_git_version": ...}``.
A process whose torch comes from such a tree reports
``overlay of <commit> on <binary git_version>`` as its git version
(:func:`overlay_identity`), so its records are stored apart from the binary's,
followed by ``(approximate: N compiled files left out)`` when the marker says
that compiled files of the commit differ from the binary's.
The bisection writes the marker; this module only reads it.
"""

from __future__ import annotations

import json
import platform
import socket
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

OVERLAY_MARKER = "syncbn_harness_overlay.json"
OVERLAY_IDENTITY = "overlay of {commit} on {base}"
APPROXIMATE = " (approximate: {n} compiled files left out)"  # what an overlay's compiled diff leaves out


def overlay_identity(torch_file: str) -> Optional[str]:
    """``overlay of <commit> on <base>`` when the torch at ``torch_file`` is an overlay tree's, else None."""
    marker = Path(torch_file).parent.parent / OVERLAY_MARKER
    try:
        d = json.loads(marker.read_text())
        identity = OVERLAY_IDENTITY.format(commit=d["commit"], base=d["binary_git_version"])
        left_out = int(d.get("compiled_left_out") or 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return identity + (APPROXIMATE.format(n=left_out) if left_out else "")


@dataclass(frozen=True)
class BuildInfo:
    """Identity of the PyTorch build a run tests."""

    torch_version: str
    torch_git_version: str
    cuda_version: Optional[str]
    cuda_available: bool
    backends: tuple[str, ...]
    python: str
    host: str

    def to_dict(self) -> dict:
        return asdict(self)


def build_info() -> BuildInfo:
    """This process's torch build; a Python overlay's commit stands in its git version
    (``overlay of <commit> on <binary git_version>``, :func:`overlay_identity`)."""
    import torch
    import torch.distributed as dist

    backends = []
    if dist.is_available():
        for name, check in (("gloo", "is_gloo_available"), ("nccl", "is_nccl_available"),
                            ("mpi", "is_mpi_available"), ("ucc", "is_ucc_available")):
            fn = getattr(dist, check, None)
            if fn is not None and fn():
                backends.append(name)
    return BuildInfo(
        torch_version=torch.__version__,
        torch_git_version=overlay_identity(torch.__file__) or str(torch.version.git_version),
        cuda_version=torch.version.cuda,
        cuda_available=torch.cuda.is_available(),
        backends=tuple(backends),
        python=platform.python_version(),
        host=socket.gethostname(),
    )


def apex_state() -> str:
    """apex's state, one sentence: not installed; without apex.parallel (PR #1896); Python fallback; optimized.

    Detected as apex itself decides (see :func:`harness.impls.apex.probe`).
    """
    from harness.impls.apex import probe

    return probe().text


def environment() -> dict:
    """Torch version and commit, CUDA, backends, kernel build state, apex state, as plain data."""
    from harness import __version__
    from harness.kernels import extension

    info = build_info()
    try:
        kernels = extension.state()
    except Exception as exc:  # noqa: BLE001 - env reports what is wrong instead of failing
        kernels = f"unknown ({type(exc).__name__}: {exc})"
    cuda_home = extension.find_cuda_home()
    return {
        "harness": __version__,
        "torch": info.torch_version,
        "torch_git_version": info.torch_git_version,
        "cuda": info.cuda_version,
        "cuda_device": info.cuda_available,
        "cuda_toolkit": str(cuda_home) if cuda_home else None,
        "backends": list(info.backends),
        "python": info.python,
        "host": info.host,
        "kernels": kernels,
        "apex": apex_state(),
    }
