"""The engine with real processes: every rank's failure attributed, nothing left behind.

Probes (tests/plugins/probes.py) misbehave on rank 1 only; each must give the
right status attributed to rank 1, in bounded time, and the next case must
still run.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from harness import catalog, runner
from harness.records import PEER_FAILED, Status
from proctools import children_of

PLUGINS = str(Path(__file__).parent / "support")
CASE = "allgather-shape/uneven-2-6/float32-float32/contiguous/ws2"
NEXT = "allgather-shape/even-4-4/float32-float32/contiguous/ws2"


@pytest.fixture(autouse=True)
def _plugins_on_path(monkeypatch):
    # Rank processes are spawned: they import the probes through PYTHONPATH.
    monkeypatch.setenv("PYTHONPATH", PLUGINS + os.pathsep + os.environ.get("PYTHONPATH", ""))


def run_probe(probe: str, timeout: float = 20.0):
    cases = catalog.select([CASE, NEXT])
    assert [c.id for c in cases] == [NEXT, CASE] or [c.id for c in cases] == [CASE, NEXT]
    cases = sorted(cases, key=lambda c: c.id != CASE)  # the probe's case first, then a normal one
    impls = runner.resolve_impls([f"probes:{probe}"])
    ref = runner.resolve_impls(["reference"])
    before = children_of(os.getpid())
    t0 = time.monotonic()
    records = list(runner.run_selection(cases[:1], impls, runner.RunOptions(timeout=timeout)))
    records += list(runner.run_selection(cases[1:], ref, runner.RunOptions(timeout=timeout)))
    elapsed = time.monotonic() - t0
    assert children_of(os.getpid()) - before == set(), "rank processes left behind"
    return records, elapsed


def rank(record, r):
    return next(o for o in record.ranks if o.rank == r)


@pytest.mark.slow
def test_exception_on_rank1_is_an_error_of_rank1():
    (bad, good), elapsed = run_probe("RaiseOnRank1")
    assert bad.status == Status.ERROR
    r1 = rank(bad, 1)
    assert r1.status == "error" and r1.exception_type == "RuntimeError"
    assert "planted failure on rank 1" in r1.message and "misbehave" in r1.traceback
    assert rank(bad, 0).status == PEER_FAILED
    assert bad.message.startswith("rank 1: error (RuntimeError: planted failure on rank 1)")
    assert good.status == Status.PASS
    assert elapsed < 60


@pytest.mark.slow
@pytest.mark.parametrize("probe,signame", [("SegfaultOnRank1", "SIGSEGV"), ("AbortOnRank1", "SIGABRT"),
                                           ("KillOnRank1", "SIGKILL")])
def test_signal_on_rank1_is_a_crash_of_rank1(probe, signame):
    (bad, good), elapsed = run_probe(probe)
    assert bad.status == Status.CRASH
    r1 = rank(bad, 1)
    assert r1.status == "crash" and r1.signal == signame and r1.exit_code < 0
    assert rank(bad, 0).status in (PEER_FAILED,)
    assert f"rank 1: crash (killed by {signame})" in bad.message
    if signame == "SIGSEGV":
        assert "Fatal Python error" in (r1.stack_dump or "")  # faulthandler's traceback of the crash
    assert good.status == Status.PASS
    assert elapsed < 60


@pytest.mark.slow
def test_exit_code_on_rank1_is_a_crash_with_that_code():
    (bad, good), _ = run_probe("ExitOnRank1")
    assert bad.status == Status.CRASH
    r1 = rank(bad, 1)
    assert r1.exit_code == 3 and r1.signal is None and "exited with code 3" in r1.message
    assert good.status == Status.PASS


@pytest.mark.slow
def test_sleeping_rank1_is_the_hang_with_a_stack_dump():
    (bad, good), elapsed = run_probe("SleepOnRank1", timeout=8)
    assert bad.status == Status.HANG
    r1, r0 = rank(bad, 1), rank(bad, 0)
    assert r1.status == "hang"
    assert "in misbehave" in r1.stack_dump and "probes.py" in r1.stack_dump  # where rank 1 sleeps
    assert r0.status == PEER_FAILED and "in all_gather" in r0.stack_dump
    assert r0.message == "waiting in a collective for ranks [1]"
    assert good.status == Status.PASS
    assert 8 <= elapsed < 60


@pytest.mark.slow
def test_skipped_collective_blames_the_rank_that_skipped():
    (bad, good), elapsed = run_probe("SkipCollectiveOnRank1", timeout=8)
    assert bad.status == Status.HANG
    r1, r0 = rank(bad, 1), rank(bad, 0)
    assert r1.status == "hang" and "did not enter" in r1.message
    assert r0.status == PEER_FAILED and "all_gather" in (r0.stack_dump or "")
    assert good.status == Status.PASS
    assert elapsed < 60


@pytest.mark.slow
def test_two_pools_at_once_get_distinct_ports():
    """Rendezvous ports come from the OS: two pools of the same size start side by side."""
    from harness.pool import Pool

    with Pool(2) as a, Pool(2) as b:
        a.start()
        b.start()
        assert a._store.port != b._store.port
        task = {"case": catalog.select([NEXT])[0].to_dict(), "impl": "reference", "device": "cpu"}
        assert a.run(task, timeout=60).status == Status.PASS
        assert b.run(task, timeout=60).status == Status.PASS
        pids = a.pids() + b.pids()
    assert all(not Path(f"/proc/{p}").exists() or "Z" in Path(f"/proc/{p}/stat").read_text().split()[2]
               for p in pids)


@pytest.mark.slow
def test_caller_rendezvous_env_does_not_leak(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "10.255.255.1")
    monkeypatch.setenv("MASTER_PORT", "1")
    monkeypatch.setenv("WORLD_SIZE", "64")
    monkeypatch.setenv("RANK", "5")
    records = list(runner.run_selection(catalog.select([NEXT]), runner.resolve_impls(["reference"]),
                                        runner.RunOptions(timeout=60)))
    assert [r.status for r in records] == [Status.PASS]
