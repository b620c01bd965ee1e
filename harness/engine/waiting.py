"""How long the parent waits for the ranks of one task: observations and clock readings in, the next step out.

Both launchers obey this rule: the local pool (:meth:`harness.engine.pool.Pool.run`)
and a torchrun job's collecting rank (:class:`harness.engine.torchrun_case.JobCase`). Nothing
here reads the clock or touches a process: the caller records what it saw
(:meth:`WaitState.answered`, :meth:`WaitState.died`, and what a probe found:
:meth:`WaitState.saw_calls`, :meth:`WaitState.saw_stack`, :meth:`WaitState.saw_deadlock`),
passes a clock reading to :meth:`WaitState.next_step`, and does what it answers:

- :class:`Wait`: wait at most ``seconds`` for answers (and deaths), then ask again;
- :class:`Probe`: read the collectives (``Look.CALLS``) or the Python stacks
  (``Look.STACK``) of the ranks named, or look for a deadlock of all of them
  (``Look.DEADLOCK``: :class:`~harness.engine.attribution.DeadlockWatch`), then ask again;
- :class:`Stop`: stop waiting, for the :class:`Reason` given.

A rank *fails* when it answers with an exception or its process ends without
an answer; it *answers* when its result arrives. The rules, in order (the
first that applies decides):

1. every rank answered or died: stop (``ANSWERED``);
2. a deadlock of every rank was proven: stop (``DEADLOCK``);
3. ``PEER_GRACE_S`` after the first failure: stop (``GRACE_OVER``); at the
   task's timeout: stop (``TIMEOUT``);
4. no rank failed, some answered, less than ``SETTLE_S`` ago: wait out the
   settling (the rest usually answer within milliseconds, and reading their
   collectives would only take a core from them);
5. some rank failed, or answered (and the settling is over): the silent ranks
   may wait for good.

   a. a rank raised inside torch.distributed and no rank has died: wait
      ``RECHECK_S`` (a dying peer likely caused that error: its death is awaited);
   b. for each silent rank in order: its collectives not read since the last
      wait: probe them; they prove it waits in a collective that cannot
      complete (:func:`~harness.engine.attribution.waits_for_good`: a done
      member of its group never issued it): the next rank; they cannot tell
      (a member died having issued as many) and its stack was never looked
      at: probe its stack, which, inside torch.distributed, proves it; anything
      else: wait ``RECHECK_S`` (it may enter its last collective any moment);
   c. every silent rank proven stuck: stop, ``PEERS_STUCK`` after a failure,
      else ``LEFT_BEHIND`` (ranks that answered skipped a collective the silent
      ones wait in);
6. nothing answered yet, ``QUIET_S`` since the start: look for a deadlock
   when the watch's pause since the last look is over, else wait for it;
7. otherwise wait until ``QUIET_S`` since the start.

Every wait is capped by what is left until rule 3 applies. The timers are
defined here and nowhere else.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Optional, Union

from harness.engine.attribution import DeadlockWatch, Observation, in_collective, waits_for_good
from harness.engine.messages import RankResult
from harness.engine.reuse import raised_in_collective
from harness.judge.status import RankStatus

PEER_GRACE_S = 3.0  # after a first failure, how long the others get to answer
RECHECK_S = 0.05  # after a failure, how often the silent ranks' collectives are read again
SETTLE_S = 0.25  # after a first answer without a failure, the others usually follow within milliseconds
QUIET_S = 1.0  # every rank silent this long: look for a deadlock (a file read per rank while they work)


class Look(enum.Enum):
    """What a probe reads of the ranks it names."""

    CALLS = "calls"  # the collectives each issued in this task
    STACK = "stack"  # a dump of each one's Python stacks
    DEADLOCK = "deadlock"  # one look of the deadlock watch over every rank


class Reason(enum.Enum):
    """Why the wait ended."""

    ANSWERED = "answered"  # every rank answered or died
    PEERS_STUCK = "peers stuck"  # after a failure, every silent rank provably waits for good
    LEFT_BEHIND = "left behind"  # no failure; the silent ranks wait in a collective the others skipped
    DEADLOCK = "deadlock"  # every rank silent, blocked in collectives that cannot match
    GRACE_OVER = "grace over"  # PEER_GRACE_S after the first failure
    TIMEOUT = "timeout"  # the task's timeout

    @property
    def early(self) -> bool:
        """Whether the silent ranks were proven stuck before the timeout (the wait's length is then the
        elapsed time, not the timeout)."""
        return self in (Reason.LEFT_BEHIND, Reason.DEADLOCK)


@dataclass(frozen=True)
class Wait:
    seconds: float


@dataclass(frozen=True)
class Probe:
    look: Look
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class Stop:
    reason: Reason


Step = Union[Wait, Probe, Stop]


@dataclass
class WaitState:
    """What the parent has seen of one task's ranks so far (see the module docstring)."""

    world: int
    started: float
    timeout: float
    observations: dict[int, Observation] = field(default_factory=dict)
    pending: set[int] = field(default_factory=set)
    first_answer: Optional[float] = None
    first_failure: Optional[float] = None
    calls: dict[int, Optional[list]] = field(default_factory=dict)  # silent ranks' collectives, since the last wait
    stacks: dict[int, str] = field(default_factory=dict)  # silent ranks whose stack was looked at (once each)
    watch: Optional[DeadlockWatch] = None
    next_look: Optional[float] = None  # when the deadlock watch may look again
    deadlocked: Optional[dict[int, str]] = None

    def __post_init__(self):
        if not self.observations:
            self.observations = {r: Observation(rank=r) for r in range(self.world)}
            self.pending = set(range(self.world))
        if self.watch is None:
            self.watch = DeadlockWatch(range(self.world))

    # ------------------------------------------------------------------ what the parent saw

    def answered(self, rank: int, result: RankResult, now: float) -> None:
        """Rank ``rank``'s result arrived at ``now``."""
        self.observations[rank].result = result
        self.first_answer = self.first_answer if self.first_answer is not None else now
        if result.status is RankStatus.ERROR:
            self.first_failure = self.first_failure if self.first_failure is not None else now
        self.pending.discard(rank)

    def died(self, rank: int, now: float, *, exit_code: Optional[int] = None, log: str = "",
             calls: Optional[list] = None) -> None:
        """Rank ``rank``'s process ended without an answer (seen at ``now``)."""
        ob = self.observations[rank]
        ob.died, ob.exit_code, ob.stack_dump, ob.collectives = True, exit_code, log, calls
        self.first_failure = self.first_failure if self.first_failure is not None else now
        self.pending.discard(rank)

    def saw_calls(self, rank: int, calls: Optional[list]) -> None:
        """A :data:`Look.CALLS` probe read ``calls`` for ``rank`` (None: unknown)."""
        self.calls[rank] = calls

    def saw_stack(self, rank: int, dump: str) -> None:
        """A :data:`Look.STACK` probe dumped ``rank``'s stacks."""
        self.stacks[rank] = dump

    def saw_deadlock(self, where: Optional[dict[int, str]], now: float) -> None:
        """A :data:`Look.DEADLOCK` probe (the watch's ``check``) found ``where`` (None: not proven) at ``now``."""
        self.deadlocked = where
        self.next_look = now + self.watch.pause

    def waited(self) -> None:
        """A wait ended: collectives read before it are stale."""
        self.calls.clear()

    # ------------------------------------------------------------------ the rule

    def next_step(self, now: float) -> Step:
        """What to do at clock reading ``now`` (the rules of the module docstring, in order)."""
        if not self.pending:
            return Stop(Reason.ANSWERED)
        if self.deadlocked:
            return Stop(Reason.DEADLOCK)
        deadline = self.started + self.timeout
        if self.first_failure is not None and self.first_failure + PEER_GRACE_S < deadline:
            if now >= self.first_failure + PEER_GRACE_S:
                return Stop(Reason.GRACE_OVER)
            deadline = self.first_failure + PEER_GRACE_S
        if now >= deadline:
            return Stop(Reason.TIMEOUT)
        left = deadline - now
        if self.first_failure is None and self.first_answer is not None and now < self.first_answer + SETTLE_S:
            return Wait(min(left, self.first_answer + SETTLE_S - now))
        if self.first_failure is not None or self.first_answer is not None:
            return self._silent_ones(left)
        if now - self.started >= QUIET_S:
            if self.next_look is None or now >= self.next_look:
                return Probe(Look.DEADLOCK, tuple(range(self.world)))
            return Wait(min(left, self.next_look - now))
        return Wait(min(left, self.started + QUIET_S - now))

    def _silent_ones(self, left: float) -> Step:
        """Rule 5: whether every silent rank provably waits for good, or what to read to tell."""
        obs = self.observations.values()
        raised_inside = any(ob.result is not None and ob.result.status is RankStatus.ERROR
                            and raised_in_collective(ob.result.traceback) for ob in obs)
        if raised_inside and not any(ob.died for ob in obs):
            return Wait(min(left, RECHECK_S))
        done = {r: (ob.result.collectives if ob.result is not None else ob.collectives or [], ob.died)
                for r, ob in self.observations.items() if r not in self.pending}
        for r in sorted(self.pending):
            if r in self.stacks and in_collective(self.stacks[r]):
                continue  # its stack showed it inside a collective a dead member had issued too
            if r not in self.calls:
                return Probe(Look.CALLS, (r,))
            verdict = waits_for_good(self.calls[r], done)
            if verdict is None and r not in self.stacks:
                return Probe(Look.STACK, (r,))
            if not verdict:
                return Wait(min(left, RECHECK_S))
        return Stop(Reason.PEERS_STUCK if self.first_failure is not None else Reason.LEFT_BEHIND)

    # ------------------------------------------------------------------ after the stop

    def evidence(self, rank: int) -> Optional[str]:
        """The stack dump that proved a silent rank stuck (a probe's, or the deadlock watch's), if one did."""
        if self.deadlocked and rank in self.watch.dumps:
            return self.watch.dumps[rank]
        dump = self.stacks.get(rank)
        return dump if dump is not None and in_collective(dump) else None

    def waited_s(self, reason: Reason, now: float) -> float:
        """The wait's length as attribution states it: the elapsed time when it ended early, else the timeout."""
        return round(now - self.started, 1) if reason.early else self.timeout
