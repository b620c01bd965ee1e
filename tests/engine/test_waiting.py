"""The waiting rule with scripted observations and a fake clock: no process, no real time.

One test per rule of :mod:`harness.engine.waiting`, in its order: every rank answered; a deadlock proven;
the grace after a failure and the timeout; the settling after a first answer; after a failure (or beside
answers), a rank that raised inside torch.distributed holds the wait open until a death, silent ranks'
collectives and (when those cannot tell) stacks are probed, one rank at a time, and the wait stops once every
silent rank is proven stuck; the deadlock watch's looks once every rank was quiet long enough; and the quiet
wait before it. A last test drives a whole task through the rule as a pool does.
"""

from __future__ import annotations

import pytest

from harness.engine.messages import RankResult
from harness.engine.waiting import (PEER_GRACE_S, QUIET_S, RECHECK_S, SETTLE_S, Look, Probe, Reason, Stop, Wait,
                                    WaitState)
from harness.judge.status import RankStatus

T0 = 100.0  # the fake clock's reading when the task was sent
IN_COLLECTIVE = 'Current thread 0x1 (most recent call first):\n  File "torch/distributed/distributed_c10d.py", line 1'
OUTSIDE = 'Current thread 0x1 (most recent call first):\n  File "model.py", line 1'
RAISED_INSIDE = 'Traceback:\n  File "torch/distributed/distributed_c10d.py", line 9, in all_gather\nRuntimeError: x'


def calls(n: int, group=(0, 1)) -> list:
    return [{"op": "all_gather", "group": list(group), "dtype": "float32", "shape": [3], "step": 0}] * n


def result(rank: int, status: RankStatus = RankStatus.PASS, n_calls: int = 1, traceback: str = "") -> RankResult:
    return RankResult(rank=rank, status=status, collectives=calls(n_calls), traceback=traceback or None)


def state(world: int = 2, timeout: float = 20.0) -> WaitState:
    return WaitState(world=world, started=T0, timeout=timeout)


def test_1_every_rank_answered_or_died_stops_at_once():
    s = state()
    s.answered(0, result(0), T0 + 0.1)
    assert s.next_step(T0 + 0.1) == Wait(pytest.approx(SETTLE_S))
    s.died(1, T0 + 0.2, exit_code=-11)
    assert s.next_step(T0 + 0.2) == Stop(Reason.ANSWERED)


def test_2_a_proven_deadlock_stops_and_its_dumps_are_the_evidence():
    s = state()
    assert s.next_step(T0 + QUIET_S) == Probe(Look.DEADLOCK, (0, 1))
    s.watch.dumps = {0: IN_COLLECTIVE, 1: IN_COLLECTIVE}
    s.saw_deadlock({0: "all_gather", 1: "broadcast"}, T0 + QUIET_S)
    assert s.next_step(T0 + QUIET_S) == Stop(Reason.DEADLOCK)
    assert s.evidence(1) == IN_COLLECTIVE
    assert s.waited_s(Reason.DEADLOCK, T0 + 2.04) == 2.0  # ended early: the elapsed time, not the timeout


def test_3_the_grace_after_a_failure_then_the_timeout():
    s = state(timeout=20.0)
    s.answered(1, result(1, RankStatus.ERROR, n_calls=1), T0 + 1.0)
    s.saw_calls(0, calls(1))  # rank 0 issued what rank 1 issued: nothing proves it stuck
    assert s.next_step(T0 + 1.0) == Wait(RECHECK_S)
    assert s.next_step(T0 + 1.0 + PEER_GRACE_S) == Stop(Reason.GRACE_OVER)
    assert s.waited_s(Reason.GRACE_OVER, T0 + 4.0) == 20.0
    quiet = state(timeout=2.0)
    quiet.answered(1, result(1), T0 + 1.9)
    assert quiet.next_step(T0 + 1.95) == Wait(pytest.approx(0.05))  # the settling, capped by the timeout
    assert quiet.next_step(T0 + 2.0) == Stop(Reason.TIMEOUT)
    late = state(timeout=2.0)  # a failure whose grace ends after the timeout: the timeout ends the wait
    late.answered(1, result(1, RankStatus.ERROR), T0 + 1.5)
    assert late.next_step(T0 + 2.0) == Stop(Reason.TIMEOUT)


def test_4_a_first_answer_without_a_failure_waits_out_the_settling_without_reading_anything():
    s = state()
    s.answered(0, result(0), T0 + 0.5)
    assert s.next_step(T0 + 0.6) == Wait(pytest.approx(SETTLE_S - 0.1))
    assert s.next_step(T0 + 0.5 + SETTLE_S) == Probe(Look.CALLS, (1,))  # settled: the silent rank may be stuck


def test_5a_an_exception_raised_inside_torch_distributed_holds_the_wait_until_a_death():
    s = state(world=3)
    s.answered(1, result(1, RankStatus.ERROR, traceback=RAISED_INSIDE), T0 + 0.5)
    assert s.next_step(T0 + 0.5) == Wait(RECHECK_S)  # a dying peer likely caused it: no probe yet
    s.died(0, T0 + 0.6, calls=calls(1, group=(0, 1, 2)))
    assert s.next_step(T0 + 0.6) == Probe(Look.CALLS, (2,))


def test_5b_silent_ranks_are_probed_one_at_a_time_collectives_first_then_a_stack_once():
    s = state(world=3)
    s.died(0, T0 + 0.5, calls=calls(1, group=(0, 1, 2)))
    assert s.next_step(T0 + 0.5) == Probe(Look.CALLS, (1,))
    s.saw_calls(1, calls(1, group=(0, 1, 2)))  # as many as the dead rank: died in it, or after it?
    assert s.next_step(T0 + 0.5) == Probe(Look.STACK, (1,))
    s.saw_stack(1, OUTSIDE)  # its stack says it is at work
    assert s.next_step(T0 + 0.5) == Wait(RECHECK_S)
    s.waited()
    assert s.next_step(T0 + 0.6) == Probe(Look.CALLS, (1,))  # read again after every wait
    s.saw_calls(1, calls(1, group=(0, 1, 2)))
    assert s.next_step(T0 + 0.6) == Wait(RECHECK_S)  # its stack is looked at once only
    t = state(world=3)
    t.died(0, T0 + 0.5, calls=calls(1, group=(0, 1, 2)))
    t.saw_calls(1, calls(1, group=(0, 1, 2)))
    t.saw_stack(1, IN_COLLECTIVE)  # inside the collective the dead rank issued: stuck for good
    assert t.next_step(T0 + 0.5) == Probe(Look.CALLS, (2,))  # and the next silent rank is read
    assert t.evidence(1) == IN_COLLECTIVE and t.evidence(2) is None


def test_5c_every_silent_rank_proven_stuck_stops_after_a_failure_and_beside_answers():
    s = state(world=3)
    s.answered(1, result(1, RankStatus.ERROR, n_calls=0), T0 + 0.5)  # raised before the all_gather
    for r in (0, 2):
        assert s.next_step(T0 + 0.5) == Probe(Look.CALLS, (r,))
        s.saw_calls(r, calls(1, group=(0, 1, 2)))
    assert s.next_step(T0 + 0.5) == Stop(Reason.PEERS_STUCK)
    assert s.waited_s(Reason.PEERS_STUCK, T0 + 0.5) == 20.0  # a failure's peers: attributed as after a timeout
    skipped = state()
    skipped.answered(1, result(1, n_calls=0), T0 + 0.5)  # answered having skipped the collective rank 0 waits in
    skipped.saw_calls(0, calls(1))
    assert skipped.next_step(T0 + 0.5 + SETTLE_S) == Stop(Reason.LEFT_BEHIND)
    assert skipped.waited_s(Reason.LEFT_BEHIND, T0 + 0.8) == 0.8


def test_6_every_rank_quiet_looks_for_a_deadlock_after_each_pause():
    s = state()
    assert s.next_step(T0 + QUIET_S) == Probe(Look.DEADLOCK, (0, 1))
    s.saw_deadlock(None, T0 + QUIET_S)  # not proven: the next look after the watch's pause
    pause = s.watch.pause
    assert s.next_step(T0 + QUIET_S + 0.1) == Wait(pytest.approx(pause - 0.1))
    assert s.next_step(T0 + QUIET_S + pause) == Probe(Look.DEADLOCK, (0, 1))


def test_7_before_quiet_s_the_rule_only_waits():
    s = state()
    assert s.next_step(T0) == Wait(QUIET_S)
    assert s.next_step(T0 + 0.4) == Wait(pytest.approx(QUIET_S - 0.4))
    assert s.next_step(T0 + QUIET_S - 1e-9) != Probe(Look.DEADLOCK, (0, 1))


def test_a_task_driven_through_the_rule_as_a_pool_drives_it():
    """Rank 1 raises before its all_gather at 0.3 s; rank 0 waits in it: the wait ends at the next step, with
    one read of rank 0's collectives, long before the grace."""
    s, now, reads = state(), T0, []
    script = {T0 + 0.3: lambda: s.answered(1, result(1, RankStatus.ERROR, n_calls=0), T0 + 0.3)}
    while True:
        step = s.next_step(now)
        if isinstance(step, Stop):
            break
        if isinstance(step, Probe):
            assert step.look is Look.CALLS
            reads.extend(step.ranks)
            s.saw_calls(0, calls(1))
            continue
        arrivals = [t for t in script if now < t <= now + step.seconds]
        now = arrivals[0] if arrivals else now + step.seconds
        if arrivals:
            script.pop(now)()
        s.waited()
    assert step == Stop(Reason.PEERS_STUCK) and now == T0 + 0.3 and reads == [0]
