"""Attribution with scripted observations: who is to blame, and when a silent rank waits for good."""

from __future__ import annotations

import pytest

from harness.engine.attribution import Observation, attribute, waits_for_good
from harness.engine.messages import RankResult
from harness.results.records import RankStatus, Status

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
