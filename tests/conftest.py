"""Isolation for the harness's own tests.

Rendezvous variables from the caller's shell must never reach a test, and
every test that spawns processes must leave none behind.
"""

from __future__ import annotations

import os

import pytest

from harness.engine import RENDEZVOUS_ENV

SCRUB = RENDEZVOUS_ENV + ("CUDA_VISIBLE_DEVICES",)


@pytest.fixture(autouse=True)
def _scrub_env(monkeypatch):
    for var in SCRUB:
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="session")
def kernels():
    """The reference extension, built once per session (and cached across sessions)."""
    import torch

    from harness.kernels import extension

    extension.load()
    return torch.ops.syncbn_ref


def pytest_report_header(config):
    try:
        import torch

        return (f"torch {torch.__version__} ({torch.version.git_version[:12]}), "
                f"cpu threads {torch.get_num_threads()}, pid {os.getpid()}")
    except ImportError:
        return "torch not importable"
