"""A pool kept after a failure that left nothing in flight, and torn down after any other.

Design: the rule (:mod:`harness.engine.reuse`) on scripted observations, then with real ranks: probes that
raise on every rank (before any collective, and after the forward's collectives) are followed on the same
pool, with the same processes, by a passing case, whose record must equal the record a fresh pool gives;
a failure that leaves a rank inside a collective (tests/engine/test_pool.py) still restarts the pool.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness import catalog
from harness.engine.attribution import Observation
from harness.engine.messages import RankResult
from harness.engine.reuse import groups_agree, raised_in_collective, reusable
from harness.engine.session import RunOptions, Session, resolve_impls
from harness.judge.status import RankStatus, Status

SUPPORT = str(Path(__file__).resolve().parents[1] / "support")
CASE = "allgather-shape/uneven-2-6/float32-float32/contiguous/ws2"
NEXT = "allgather-shape/even-4-4/float32-float32/contiguous/ws2"
LAYER = {"scenario": "layer"}


def call(op, group=(0, 1), numel=9):
    return {"op": op, "group": list(group), "dtype": "float32", "numel": numel, "step": 0}


def obs(rank, status=RankStatus.ERROR, calls=(), traceback="Traceback ...\n  File \"mine.py\"\nValueError: x"):
    return Observation(rank=rank, result=RankResult(rank=rank, status=status, traceback=traceback,
                                                    collectives=list(calls)))


def test_matching_collectives_leave_nothing_in_flight():
    assert groups_agree({0: [call("all_gather")], 1: [call("all_gather")]})
    assert groups_agree({0: [], 1: []})
    assert not groups_agree({0: [call("all_gather")], 1: []})  # rank 1 never took part
    assert not groups_agree({0: [call("all_gather", numel=9)], 1: [call("all_gather", numel=17)]})
    assert not groups_agree({0: [call("all_gather"), call("all_reduce")], 1: [call("all_reduce"),
                                                                               call("all_gather")]})
    # Subgroups: each group's members must agree; a rank outside a group owes it nothing.
    pairs = {0: [call("all_gather", (0, 1))], 1: [call("all_gather", (0, 1))], 2: [call("all_gather", (2, 3))],
             3: [call("all_gather", (2, 3))]}
    assert groups_agree(pairs)
    assert not groups_agree({**pairs, 3: []})
    assert not groups_agree({0: None, 1: []})  # unknown: not proven


def test_the_rule():
    both = [obs(0, calls=[call("all_gather")]), obs(1, calls=[call("all_gather")])]
    assert reusable(LAYER, both, [RankStatus.ERROR, RankStatus.ERROR])
    assert reusable(LAYER, [obs(0, RankStatus.PASS), obs(1)], [RankStatus.PASS, RankStatus.ERROR])
    assert not reusable(LAYER, both, [RankStatus.ERROR, RankStatus.PEER_FAILED])
    assert not reusable(LAYER, [obs(0), Observation(rank=1, died=True)], [RankStatus.ERROR, RankStatus.CRASH])
    assert not reusable(LAYER, [obs(0), Observation(rank=1)], [RankStatus.ERROR, RankStatus.HANG])  # silent
    inside = 'File "/x/torch/distributed/distributed_c10d.py", line 3, in all_gather\nRuntimeError: gloo'
    assert raised_in_collective(inside) and not raised_in_collective("ValueError: mine")
    assert not reusable(LAYER, [obs(0, traceback=inside), obs(1)], [RankStatus.ERROR, RankStatus.ERROR])
    assert not reusable({"scenario": "model"}, both, [RankStatus.ERROR] * 2)  # DDP talks below the recorder
    assert not reusable({"scenario": "layer", "compile": ["inductor"]}, both, [RankStatus.ERROR] * 2)
    assert reusable({"scenario": "inference"}, both, [RankStatus.ERROR] * 2)  # the implementation's own, recorded


def test_a_pool_without_a_process_group_has_nothing_in_flight():
    """No transport exists: an exception raised inside torch.distributed (it refused: no group) leaves nothing."""
    alone = {"scenario": "layer", "backend": "no-group"}
    refused = 'File "/x/torch/distributed/distributed_c10d.py", in get_world_size\nValueError: not initialized'
    assert reusable(alone, [obs(0, traceback=refused)], [RankStatus.ERROR])
    assert reusable({**alone, "scenario": "inference"}, [obs(0, RankStatus.MISMATCH)], [RankStatus.MISMATCH])
    assert not reusable(alone, [Observation(rank=0, died=True)], [RankStatus.CRASH])
    assert not reusable(alone, [Observation(rank=0)], [RankStatus.HANG])
    assert not reusable({**alone, "scenario": "model"}, [obs(0)], [RankStatus.ERROR])


@pytest.fixture
def probes_on_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", SUPPORT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def comparable(record):
    return record.status, record.message, {k: m.to_dict() for k, m in record.metrics.items()}


@pytest.mark.slow
@pytest.mark.parametrize("probe", ["RaiseOnEveryRank", "RaiseOnEveryRankAfterForward"])
def test_after_a_failure_every_rank_caught_the_pool_runs_on_as_a_fresh_one(probes_on_path, probe):
    [bad_case], [next_case] = catalog.select([CASE]), catalog.select([NEXT])
    probe_impl, ref = resolve_impls([f"probes:{probe}", "reference"])
    session = Session([probe_impl, ref], RunOptions(timeout=30, diagnose=False))
    try:
        bad = session.run_one(bad_case, probe_impl)
        pool = session.pools[(2, "gloo")]
        pids = [p.pid for p in pool.procs]
        assert bad.status == Status.ERROR and "planted failure on every rank" in bad.message
        assert all(o.status is RankStatus.ERROR for o in bad.ranks)
        assert pool.alive and pool.reused_after_failure == 1
        good = session.run_one(next_case, ref)
        assert [p.pid for p in pool.procs] == pids, "the next case ran on the same processes"
    finally:
        session.close()
    fresh_session = Session([ref], RunOptions(timeout=30, diagnose=False))
    try:
        fresh = fresh_session.run_one(next_case, ref)
    finally:
        fresh_session.close()
    assert good.status == Status.PASS and comparable(good) == comparable(fresh)
