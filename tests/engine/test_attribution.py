"""Attribution with scripted observations: who is to blame, and when a silent rank waits for good."""

from __future__ import annotations

import pytest

from harness.engine.attribution import DeadlockWatch, Observation, attribute, blocked_at, deadlock, waits_for_good
from harness.engine.messages import RankResult
from harness.judge.status import RankStatus, Status

WORLD = [0, 1]
IN_COLLECTIVE = 'Current thread 0x1 (most recent call first):\n  File "torch/distributed/distributed_c10d.py", line 1'
OUTSIDE = 'Current thread 0x1 (most recent call first):\n  File "model.py", line 1'


def _calls(n: int, group=WORLD) -> list:
    return [{"op": "all_gather", "group": list(group), "dtype": "float32", "shape": [3], "step": 0}] * n


@pytest.mark.parametrize("silent, done, verdict", [
    (_calls(0), {0: (_calls(0), False)}, False),              # issued nothing: computing
    (_calls(2), {0: (_calls(1), False)}, True),               # the finished rank never issued the second
    (_calls(2), {0: (_calls(1), True)}, True),                # nor did the dead one
    (_calls(1), {0: (_calls(1), True)}, None),                # the dead one issued it: died in it, or after?
    (_calls(1), {0: (_calls(1), False)}, False),              # issued by a live finished rank: it completed
    (_calls(1), {0: (_calls(2), False)}, False),              # the silent rank is behind, not stuck
    (_calls(2, [1, 2]), {0: (_calls(0), True)}, False),       # the dead rank is not in its collective's group
])
def test_a_silent_rank_waits_for_good_only_on_a_collective_a_done_member_cannot_join(silent, done, verdict):
    assert waits_for_good(silent, done) is verdict


def _answered(rank: int, status: RankStatus, message: str = "", traceback: str = "") -> Observation:
    return Observation(rank=rank, result=RankResult(rank=rank, status=status, message=message, traceback=traceback))


def test_a_death_first_makes_the_silent_peer_peer_failed_and_the_case_a_crash():
    status, outcomes = attribute([Observation(rank=0, died=True, exit_code=-6),
                                  Observation(rank=1, stack_dump=IN_COLLECTIVE)],
                                 failed_first=True, timeout=30)
    assert status is Status.CRASH
    assert [o.status for o in outcomes] == [RankStatus.CRASH, RankStatus.PEER_FAILED]
    assert outcomes[0].signal == "SIGABRT"


def test_a_collective_error_after_a_sibling_crashed_is_the_siblings_doing():
    status, outcomes = attribute([Observation(rank=0, died=True, exit_code=-11),
                                  _answered(1, RankStatus.ERROR, "Connection closed by peer",
                                            'File "torch/distributed/distributed_c10d.py", line 1')],
                                 failed_first=True, timeout=30)
    assert status is Status.CRASH and outcomes[1].status is RankStatus.PEER_FAILED


def test_at_the_timeout_the_rank_outside_a_collective_is_the_hang():
    status, outcomes = attribute([Observation(rank=0, stack_dump=OUTSIDE),
                                  Observation(rank=1, stack_dump=IN_COLLECTIVE)],
                                 failed_first=False, timeout=30)
    assert status is Status.HANG
    assert [o.status for o in outcomes] == [RankStatus.HANG, RankStatus.PEER_FAILED]


def test_ranks_that_returned_while_the_others_wait_in_a_collective_did_not_enter_it():
    status, outcomes = attribute([_answered(0, RankStatus.PASS),
                                  Observation(rank=1, stack_dump=IN_COLLECTIVE)],
                                 failed_first=False, timeout=30)
    assert status is Status.HANG and outcomes[0].status is RankStatus.HANG
    assert "did not enter" in outcomes[0].message


def _op(op: str, n: int, group=WORLD) -> list:
    return [{"op": op, "group": list(group), "dtype": "float32", "shape": [3], "step": 0}] * n


@pytest.mark.parametrize("calls, stuck", [
    ({0: _op("all_gather", 2), 1: _op("all_gather", 2)}, False),  # one collective together: slow, maybe
    ({0: _op("all_gather", 2), 1: _op("all_reduce", 2)}, True),   # two operations at the same place
    ({0: _op("all_gather", 3), 1: _op("all_gather", 2)}, True),   # rank 1 blocked in a call it did not record
    ({0: _op("all_gather", 2), 1: []}, False),                    # rank 1 recorded nothing: nothing to prove
    ({0: _op("all_gather", 1, [0, 1]), 1: _op("all_gather", 1, [0, 1]),
      2: _op("all_gather", 1, [2, 3]), 3: _op("all_reduce", 1, [2, 3])}, False),  # ranks 0, 1 may complete
])
def test_a_deadlock_is_told_only_where_no_group_can_be_in_one_collective(calls, stuck):
    where = deadlock(calls)
    assert (where is not None) is stuck
    if stuck:
        assert set(where) == set(calls) and where[0].startswith("all_gather, its collective")


def test_a_blocked_frame_is_the_innermost_one_in_torch_distributed_or_ddp():
    ddp = 'Current thread 0x1 (most recent call first):\n  File "torch/nn/parallel/distributed.py", line 9 in h'
    assert blocked_at(IN_COLLECTIVE) and blocked_at(ddp)
    # Deeper torch.distributed frames do not count: the rank is at work in a frame of its own.
    assert blocked_at(OUTSIDE + '\n  File "torch/distributed/algorithms/join.py", line 3 in __exit__') is None


def test_a_deadlock_holds_after_two_looks_that_agree_and_never_while_a_rank_is_at_work():
    calls = {0: _op("all_gather", 2), 1: _op("all_reduce", 2)}
    stacks = {0: IN_COLLECTIVE, 1: IN_COLLECTIVE}
    watch = DeadlockWatch([0, 1])
    assert watch.check(calls.get, stacks.get) is None  # the first look only notes what it saw
    assert watch.check(calls.get, stacks.get) == deadlock(calls)
    busy = DeadlockWatch([0, 1])
    for _ in range(4):
        assert busy.check(calls.get, {0: IN_COLLECTIVE, 1: OUTSIDE}.get) is None
    assert busy.pause > watch.pause  # and it looks less often
    moving = DeadlockWatch([0, 1])
    assert moving.check(calls.get, stacks.get) is None
    assert moving.check({0: _op("all_gather", 2), 1: _op("all_reduce", 3)}.get, stacks.get) is None  # it moved

