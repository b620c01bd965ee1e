"""Isolation for the harness's own tests.

Rendezvous variables from the caller's shell must never reach a test, and
every test that spawns processes must leave none behind. The session's harness
cache shares built things with the default cache but keeps its failure logs to
itself (:func:`_session_cache`). Tests whose rank processes import plugins from
``tests/support`` take :func:`support_on_path`. Tests marked ``cuda`` are
skipped, saying why, where torch sees no GPU (:func:`no_gpu_reason`);
``nox -s gpu`` runs them where it does.

Two tiers: tests marked ``sweep(seconds)`` (20 s or more on two cores: sweeps
over a selection, searches, bisections over built environments) are left out
by default (``-m "not sweep"`` in the project's pytest options) and run with
``-m sweep``, which ``.ci/run`` gives after the main suite. Within a run the
longest go first (by their measured seconds, then ``slow``), and xdist hands
them out one at a time (:func:`pytest_xdist_make_scheduler`), so that neither
worker is left with a long test at the end while the other idles.

Bytecode: the tests and every process they start write Python's bytecode
caches, whatever ``PYTHONDONTWRITEBYTECODE`` says (machines of the kind CI
runs on set it, and with torch installed ``--no-compile`` every process that
imported torch then compiled its sources anew: 6 s against 2.7 s cached,
measured here, in each of hundreds of processes). Users' machines write them
too, so the tests run as the harness runs there.
"""

from __future__ import annotations

import os
import sys

os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # before torch is imported here or in any process started later
sys.dont_write_bytecode = False

import pytest  # noqa: E402

from harness.engine import RENDEZVOUS_ENV  # noqa: E402

SCRUB = RENDEZVOUS_ENV + ("CUDA_VISIBLE_DEVICES",)


@pytest.fixture(autouse=True)
def _scrub_env(monkeypatch):
    for var in SCRUB:
        monkeypatch.delenv(var, raising=False)


SUPPORT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "support")


@pytest.fixture(scope="session", autouse=True)
def _session_cache(tmp_path_factory):
    """Every test's harness cache, unless the test names its own: a folder of this session (under pytest's
    temporary folders, which keep the last few sessions) whose kernels, inductor code, environments and other
    built things are links to the default cache's, but whose ``logs`` and ``torchrun`` folders are its own. The
    tests that plant crashes and hangs keep their rank logs there, not among the user's."""
    from harness.paths import CACHE, CACHE_FOLDERS, cache_folder

    own = {"logs", "torchrun"}
    cache = tmp_path_factory.mktemp("harness-cache")
    for kind, name in CACHE_FOLDERS.items():
        if kind not in own:
            shared = cache_folder(kind)
            shared.mkdir(parents=True, exist_ok=True)
            (cache / name).symlink_to(shared, target_is_directory=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CACHE, str(cache))
        yield cache


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


@pytest.fixture
def own_cache(tmp_path):
    """A cache folder of the test's own (for ``SYNCBN_HARNESS_CACHE``: logs, torchrun's job folders, nothing of
    other tests) whose ``kernels`` are the default cache's: the reference kernels are not built again (tens of
    seconds of compiling), or are built once there for every test."""
    from shared_kernels import cache_sharing_kernels

    return cache_sharing_kernels(tmp_path / "cache")


CUDA_TORCH_PYTHON_ENV = "SYNCBN_HARNESS_CUDA_TORCH_PYTHON"


@pytest.fixture
def cuda_torch_python() -> str:
    """A Python whose torch is a CUDA build (``$SYNCBN_HARNESS_CUDA_TORCH_PYTHON``; `.ci/run` lends the CUDA
    compile check's venv); the test is skipped, saying so, where none is named."""
    python = os.environ.get(CUDA_TORCH_PYTHON_ENV)
    if not python:
        pytest.skip(f"set {CUDA_TORCH_PYTHON_ENV} to a Python whose torch is a CUDA build "
                    "(.ci/run sets it to the CUDA-compile check's venv)")
    return python


# Modules whose tests share a module fixture of tens of seconds (real runs into a store): all of a module's
# tests go to one worker, so that the fixture is made once, not once on each.
SHARED_FIXTURE_MODULES = ("tests/results/test_report.py", "tests/results/test_gate.py")


def pytest_xdist_make_scheduler(config, log):
    """Tests one at a time (at most three queued on a worker), in the order collected (longest first), but the
    tests of :data:`SHARED_FIXTURE_MODULES` together. xdist's default instead handed each worker a quarter of
    its share at once: with the longest first, one worker got nearly every long test and ran for 720 s while
    the other finished at 444 s.

    The sweeps (``-m sweep``) keep xdist's default: it gives the first worker the four longest, three of them
    the judgement sweeps, which then run one after another and never against each other (each keeps both
    cores busy with ranks of its own). Measured in one sitting: 1,280 s that way, 1,500 s one at a time."""
    if (config.getoption("markexpr", "") or "").strip() == "sweep":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class OneAtATime(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::")[0]
            return module if module in SHARED_FIXTURE_MODULES else nodeid

    return OneAtATime(config, log)


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


def expected_seconds(item) -> float:
    """What ordering goes by: a sweep's or a ``slow(seconds)`` test's measured seconds, a few for another ``slow``
    test, none otherwise (so that no xdist worker is left with a long test at the end)."""
    for name, default in (("sweep", 20.0), ("slow", 5.0)):
        marker = item.get_closest_marker(name)
        if marker is not None:
            return float(marker.args[0]) if marker.args else default
    return 0.0


def pytest_collection_modifyitems(config, items):
    # Stable: tests of equal weight keep their file order (every xdist worker must collect the same order).
    items.sort(key=lambda item: -expected_seconds(item))
    cuda_items = [item for item in items if item.get_closest_marker("cuda") is not None]
    reason = no_gpu_reason() if cuda_items else None
    if reason:
        for item in cuda_items:
            item.add_marker(pytest.mark.skip(reason=reason))
