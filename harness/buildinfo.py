"""The build under test: torch version and commit, CUDA, backends, apex state, host; what ``env`` prints.

Everything here is read from the installed packages at run time; records and
store keys are made from :func:`build_info`.

A Python overlay (a torch tree whose Python files are another commit's, laid
over an installed binary by the bisection) carries :data:`OVERLAY_MARKER`
beside its ``torch`` package: ``{"commit": ..., "binary_git_version": ...,
"compiled_left_out": N}``. A process whose torch comes from such a tree has
its identity as a field, :attr:`BuildInfo.overlay`
(:class:`~harness.results.records.Overlay`, :func:`overlay_identity`): its
records carry it and are stored apart from the binary's, under a key made of
it. Its git version, for people, says the same in words
(:meth:`Overlay.describe`): ``overlay of <commit> on <binary git_version>``,
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

from harness.results.records import Overlay

OVERLAY_MARKER = "syncbn_harness_overlay.json"


def overlay_identity(torch_file: str) -> Optional[Overlay]:
    """The overlay the torch at ``torch_file`` is (read from its tree's marker), else None."""
    marker = Path(torch_file).parent.parent / OVERLAY_MARKER
    try:
        d = json.loads(marker.read_text())
        return Overlay(d["commit"], d["binary_git_version"], int(d.get("compiled_left_out") or 0))
    except (OSError, ValueError, KeyError, TypeError):
        return None


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
    overlay: Optional[Overlay] = None  # a Python overlay's identity (then torch_git_version describes it)

    def to_dict(self) -> dict:
        return asdict(self)


def build_info() -> BuildInfo:
    """This process's torch build; a Python overlay's identity is its ``overlay``, and its git version says it in
    words (``overlay of <commit> on <binary git_version>``, :func:`overlay_identity`)."""
    import torch
    import torch.distributed as dist

    backends = []
    if dist.is_available():
        for name, check in (("gloo", "is_gloo_available"), ("nccl", "is_nccl_available"),
                            ("mpi", "is_mpi_available"), ("ucc", "is_ucc_available")):
            fn = getattr(dist, check, None)
            if fn is not None and fn():
                backends.append(name)
    overlay = overlay_identity(torch.__file__)
    return BuildInfo(
        torch_version=torch.__version__,
        torch_git_version=overlay.describe() if overlay else str(torch.version.git_version),
        cuda_version=torch.version.cuda,
        cuda_available=torch.cuda.is_available(),
        backends=tuple(backends),
        python=platform.python_version(),
        host=socket.gethostname(),
        overlay=overlay,
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
