"""What ``syncbn-harness env`` prints: the build under test and what it can run."""

from __future__ import annotations

from harness import __version__


def environment() -> dict:
    """Torch version and commit, CUDA, backends, kernel build state, apex state, as plain data."""
    from harness import extension
    from harness.buildinfo import apex_state, build_info

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
