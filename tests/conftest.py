"""Isolation for the harness's own tests.

Rendezvous variables from the caller's shell must never reach a test, and
every test that spawns processes must leave none behind. Tests whose rank
processes import plugins from ``tests/support`` take :func:`support_on_path`. Tests marked ``cuda``
are skipped, saying why, where torch sees no GPU (:func:`no_gpu_reason`);
``nox -s gpu`` runs them where it does.
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


SUPPORT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "support")


@pytest.fixture
def support_on_path(monkeypatch):
    """``tests/support`` on the PYTHONPATH the rank processes inherit (plugins named ``module:Class`` there)."""
    monkeypatch.setenv("PYTHONPATH", SUPPORT + os.pathsep + os.environ.get("PYTHONPATH", ""))


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


def no_gpu_reason():
    """Why ``cuda``-marked tests cannot run here (None where torch sees a GPU)."""
    import torch

    if torch.cuda.is_available():
        return None
    build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
    return (f"needs a CUDA device: torch {torch.__version__} ({build}) sees none here; "
            "`syncbn-harness gpu-suite` runs these on a machine with a GPU")


def pytest_collection_modifyitems(config, items):
    cuda_items = [item for item in items if item.get_closest_marker("cuda") is not None]
    reason = no_gpu_reason() if cuda_items else None
    if reason:
        for item in cuda_items:
            item.add_marker(pytest.mark.skip(reason=reason))
