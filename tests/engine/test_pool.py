"""The engine with real processes: every rank's failure attributed, the pool recovered, nothing left behind.

Probes (tests/support/probes.py) misbehave on rank 1 only. Each failure must
give the right status attributed to rank 1, in bounded time; and in the same
session (the same pool set) the next case must then run on fresh ranks and
pass, with no trace of the failure in its record.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from harness import catalog
from harness.engine.waiting import PEER_GRACE_S
from harness.engine.session import RunOptions, Session, resolve_impls, run_selection
from harness.judge.status import RankStatus, Status
from proctools import children_of, rank_processes

SUPPORT = str(Path(__file__).resolve().parents[1] / "support")
CASE = "allgather-shape/uneven-2-6/float32-float32/contiguous/ws2"
NEXT = "allgather-shape/even-4-4/float32-float32/contiguous/ws2"


@pytest.fixture(autouse=True)
def _probes_on_path(monkeypatch):
    # Rank processes are spawned: they import the probes through PYTHONPATH.
    monkeypatch.setenv("PYTHONPATH", SUPPORT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def failing_then_passing(probe: str, timeout: float = 20.0):
    """In one session: the probe's case, then a normal case on the same world size's pool."""
    [bad_case], [next_case] = catalog.select([CASE]), catalog.select([NEXT])
    probe_impl, ref = resolve_impls([f"probes:{probe}", "reference"])
    before = children_of(os.getpid())
    t0 = time.monotonic()
    session = Session([probe_impl, ref], RunOptions(timeout=timeout, diagnose=False))
    try:
        assert session.run_one(next_case, ref).status == Status.PASS  # warm: the pool's start is not the failure's
        bad = session.run_one(bad_case, probe_impl)
        pool = session.pools[(2, "gloo")]
        assert not pool.alive, "a failed case must tear its pool down"
        good = session.run_one(next_case, ref)
        assert session.pools[(2, "gloo")] is pool and pool.alive, \
            "the next case runs on a restarted pool of the same session"
    finally:
        session.close()
    elapsed = time.monotonic() - t0
    assert children_of(os.getpid()) - before == set(), "rank processes left behind"
    assert rank_processes(os.getpid()) == set(), "forked rank processes left behind"
    assert good.status == Status.PASS, good.message
    assert good.message == "" and all(o.status is RankStatus.PASS for o in good.ranks)
    assert not any(o.traceback or o.stack_dump or o.exception_type for o in good.ranks), "stale failure data"
    return bad, elapsed


def rank(record, r):
    return next(o for o in record.ranks if o.rank == r)


@pytest.mark.slow
def test_exception_on_rank1_is_an_error_of_rank1():
    bad, elapsed = failing_then_passing("RaiseOnRank1")
    assert bad.status == Status.ERROR
    r1 = rank(bad, 1)
    assert r1.status is RankStatus.ERROR and r1.exception_type == "RuntimeError"
    assert "planted failure on rank 1" in r1.message and "misbehave" in r1.traceback
    assert rank(bad, 0).status is RankStatus.PEER_FAILED
    assert bad.message.startswith("rank 1: error (RuntimeError: planted failure on rank 1)")
    assert elapsed < 60
    # Rank 0 waits in an all_gather rank 1 never issued: no grace period is waited out.
    assert bad.duration_s < PEER_GRACE_S / 2, bad.duration_s


@pytest.mark.slow
@pytest.mark.parametrize("probe,signame", [("SegfaultOnRank1", "SIGSEGV"), ("AbortOnRank1", "SIGABRT"),
                                           ("KillOnRank1", "SIGKILL")])
def test_signal_on_rank1_is_a_crash_of_rank1(probe, signame):
    bad, elapsed = failing_then_passing(probe)
    assert bad.status == Status.CRASH
    r1 = rank(bad, 1)
    assert r1.status is RankStatus.CRASH and r1.signal == signame and r1.exit_code < 0
    assert rank(bad, 0).status is RankStatus.PEER_FAILED
    assert f"rank 1: crash (killed by {signame})" in bad.message
    if signame == "SIGSEGV":
        assert "Fatal Python error" in (r1.stack_dump or "")  # faulthandler's traceback of the crash
    assert elapsed < 60
    assert bad.duration_s < PEER_GRACE_S / 2, bad.duration_s


@pytest.mark.slow
def test_a_rank_dying_inside_a_collective_leaves_its_peer_stuck_and_that_is_seen_at_once():
    """torch's known empty-rank crash: rank 0 issues the all_gather with a half row and gloo aborts it inside the
    collective, which rank 1 issued too. Only rank 1's stack can tell it is stuck there; it is read at once."""
    [case], [warm] = catalog.select(["mixed-precision/empty-rank/float16-float32/ws2"]), catalog.select([NEXT])
    [torch_impl] = resolve_impls(["torch"])
    session = Session([torch_impl], RunOptions(timeout=20, diagnose=False))
    try:
        assert session.run_one(warm, torch_impl).status == Status.PASS  # the pool's start is not the crash's time
        bad = session.run_one(case, torch_impl)
    finally:
        session.close()
    assert bad.status == Status.CRASH and bad.known, bad.message
    stuck = next(o for o in bad.ranks if o.status is RankStatus.PEER_FAILED)
    # Rank 1 stays inside the all_gather, or gets through it (rank 0's row arrived before its abort) and waits in
    # the next collective, or gloo tells it the peer is gone: either way it issued the all_gather rank 0 died in.
    assert stuck.collectives and stuck.collectives[0]["op"] == "all_gather", stuck
    assert bad.duration_s < PEER_GRACE_S / 2, bad.duration_s


@pytest.mark.slow
def test_peers_that_raised_in_a_collective_do_not_hold_the_wait_open_once_a_rank_died():
    """An error raised inside torch.distributed keeps the wait open until a death is seen (a dying peer usually
    caused it), and no longer: rank 0 aborts, ranks 1 and 3 raise inside a collective, and rank 2, stuck inside
    the statistics all_gather, is read at once instead of after the whole grace (as in torch's empty-rank crash
    on four ranks, which cost every such run of a search 3 s)."""
    [case] = catalog.select(["allgather-shape/uneven-3-1-4-2/float32-float32/contiguous/ws4"])
    probe, ref = resolve_impls(["probes:AbortOnRank0WhilePeersRaiseInACollective", "reference"])
    session = Session([probe, ref], RunOptions(timeout=20, diagnose=False))
    try:
        assert session.run_one(case, ref).status == Status.PASS  # the pool's start is not the crash's time
        bad = session.run_one(case, probe)
    finally:
        session.close()
    assert bad.duration_s < PEER_GRACE_S / 2, bad.duration_s
    assert bad.status == Status.CRASH, bad.message
    assert [o.rank for o in bad.ranks if o.status is RankStatus.CRASH] == [0] and rank(bad, 0).signal == "SIGABRT"
    assert all(rank(bad, r).status is RankStatus.PEER_FAILED for r in (1, 2, 3)), bad.ranks
    assert rank(bad, 2).stack_dump and not rank(bad, 2).exception_type, rank(bad, 2)  # read inside the all_gather


@pytest.mark.slow
def test_exit_code_on_rank1_is_a_crash_with_that_code():
    bad, _ = failing_then_passing("ExitOnRank1")
    assert bad.status == Status.CRASH
    r1 = rank(bad, 1)
    assert r1.exit_code == 3 and r1.signal is None and "exited with code 3" in r1.message


@pytest.mark.slow
def test_sleeping_rank1_is_the_hang_with_a_stack_dump():
    bad, elapsed = failing_then_passing("SleepOnRank1", timeout=8)
    assert bad.status == Status.HANG
    r1, r0 = rank(bad, 1), rank(bad, 0)
    assert r1.status is RankStatus.HANG
    assert "in misbehave" in r1.stack_dump and "probes.py" in r1.stack_dump  # where rank 1 sleeps
    assert r0.status is RankStatus.PEER_FAILED and "in all_gather" in r0.stack_dump
    assert r0.message == "waiting in a collective for ranks [1]"
    assert 8 <= elapsed < 60


@pytest.mark.slow
def test_skipped_collective_blames_the_rank_that_skipped():
    bad, elapsed = failing_then_passing("SkipCollectiveOnRank1", timeout=8)
    assert bad.status == Status.HANG
    r1, r0 = rank(bad, 1), rank(bad, 0)
    assert r1.status is RankStatus.HANG and "did not enter" in r1.message
    assert r0.status is RankStatus.PEER_FAILED and "all_gather" in (r0.stack_dump or "")
    assert elapsed < 60


@pytest.mark.slow
def test_mismatched_collectives_are_a_deadlock_ended_before_the_timeout():
    # Rank 0 in the statistics all_gather, rank 1 in an all_reduce: each waits for a call the other never makes.
    bad, elapsed = failing_then_passing("OtherCollectiveOnRank1", timeout=40)
    assert bad.status == Status.HANG, bad.message
    r0, r1 = rank(bad, 0), rank(bad, 1)
    assert r0.status is RankStatus.HANG and r0.message.startswith("deadlocked in all_gather"), r0.message
    assert r1.status is RankStatus.HANG and r1.message.startswith("deadlocked in all_reduce"), r1.message
    assert "in all_gather" in r0.stack_dump and "in misbehave" in r1.stack_dump  # the evidence: both stacks
    assert elapsed < 25, f"{elapsed:.1f}s: a proven deadlock must not wait for the 40 s timeout"


@pytest.mark.slow
def test_two_pools_at_once_get_distinct_ports():
    """Rendezvous ports come from the OS: two pools of the same size start side by side."""
    from harness.engine.messages import Task
    from harness.engine.pool import Pool

    with Pool(2) as a, Pool(2) as b:
        a.start()
        b.start()
        assert a.port != b.port
        task = Task(case=catalog.select([NEXT])[0].to_dict(), impl="reference")
        assert a.run(task, timeout=60).status == Status.PASS
        assert b.run(task, timeout=60).status == Status.PASS
        pids = a.pids() + b.pids()
    assert all(not Path(f"/proc/{p}").exists() or "Z" in Path(f"/proc/{p}/stat").read_text().split()[2]
               for p in pids)


@pytest.mark.slow
def test_caller_rendezvous_env_does_not_reach_the_ranks(monkeypatch):
    """A probe raises on any rank that sees MASTER_ADDR & co.: the pool must scrub them."""
    for var, value in (("MASTER_ADDR", "10.255.255.1"), ("MASTER_PORT", "1"), ("WORLD_SIZE", "64"), ("RANK", "5"),
                       ("LOCAL_RANK", "3"), ("TORCHELASTIC_RUN_ID", "not-this-job")):
        monkeypatch.setenv(var, value)
    records = list(run_selection(catalog.select([NEXT]), resolve_impls(["probes:FailsOnRendezvousEnv"]),
                                 RunOptions(timeout=60)))
    assert [r.status for r in records] == [Status.PASS], records[0].message


def test_pools_leave_no_log_folder_behind_and_crash_records_keep_their_evidence(tmp_path, monkeypatch):
    """Rank logs live in a folder per pool start; what a record needs of them is read before teardown, so the
    folder goes with the pool, after a pass and after a crash alike (a long search starts hundreds of pools)."""
    import tempfile

    from harness.engine import logs

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    kept_root = tmp_path / "cache" / "logs"
    monkeypatch.setattr(logs, "failure_logs_root", lambda: kept_root)
    records = list(run_selection(catalog.select([CASE, NEXT]), resolve_impls(["probes:SegfaultOnRank1", "reference"]),
                                 RunOptions(timeout=60, diagnose=False)))
    crash = next(r for r in records if r.impl == "probes:SegfaultOnRank1")
    assert crash.status == Status.CRASH and crash.ranks[1].signal == "SIGSEGV"
    assert crash.ranks[1].stack_dump  # the log tail was read into the record before the folder went
    assert any(r.status == Status.PASS for r in records if r.impl == "reference")
    assert not list(tmp_path.glob("syncbn-pool-*")), list(tmp_path.iterdir())
    # The crash's rank logs were moved into the cache, where its record points; the passing case kept none.
    assert crash.logs and Path(crash.logs).parent == kept_root, crash.logs
    assert sorted(p.name for p in Path(crash.logs).glob("rank*.log")) == ["rank0.log", "rank1.log"]
    assert all(r.logs is None for r in records if r.status == Status.PASS)


def test_folders_of_a_killed_harness_are_swept_by_the_next_pool(tmp_path):
    """A SIGKILLed harness cannot remove its pools' folders; the next pool start removes those whose owner is
    gone, and leaves a live harness's alone."""
    import subprocess
    import sys

    from harness.engine import logs

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / f"{logs.POOL_PREFIX}{dead.pid}-ws2-abc").mkdir()
    (tmp_path / f"{logs.POOL_PREFIX}{os.getpid()}-ws2-def").mkdir()
    (tmp_path / "unrelated").mkdir()
    assert logs.sweep_orphans(tmp_path) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"{logs.POOL_PREFIX}{os.getpid()}-ws2-def",
                                                                 "unrelated"])


def test_kept_rank_logs_are_bounded(tmp_path):
    """At most MAX_KEPT failing cases' log folders stay in the cache: the oldest go first."""
    from harness.engine import logs

    root = tmp_path / "logs"
    root.mkdir()
    for i in range(logs.MAX_KEPT + 5):
        (root / f"old-{i:03d}").mkdir()
        os.utime(root / f"old-{i:03d}", (1000 + i, 1000 + i))
    assert logs.prune(root) == 5
    assert sorted(p.name for p in root.iterdir())[0] == "old-005"


def test_prestarted_pools_start_while_the_parent_goes_on_and_leave_nothing_behind():
    """``Session.prestart`` spawns the ranks and returns at once; the first task of each pool waits for the rest."""
    [case] = catalog.select(["allgather-shape/empty-3-0-2/float32-float32/contiguous/ws3"])
    [ref] = resolve_impls(["reference"])
    before = children_of(os.getpid())
    session = Session([ref], RunOptions(timeout=60, diagnose=False))
    try:
        t0 = time.monotonic()
        session.prestart([(2, "gloo"), (3, "gloo")])
        assert time.monotonic() - t0 < 2.0, "prestart waited for the ranks"
        assert all(session.pools[k].alive for k in [(2, "gloo"), (3, "gloo")])
        record = session.run_one(case, ref)
        assert record.status == Status.PASS, record.message
    finally:
        session.close()
    assert children_of(os.getpid()) - before == set(), "rank processes left behind"
    assert rank_processes(os.getpid()) == set(), "forked rank processes left behind"
