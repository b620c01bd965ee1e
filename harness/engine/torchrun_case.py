"""One case of a torchrun job, as its ranks see it: its keys in the job's store and when to stop waiting.

Every rank runs the case; a rank whose task returned (the writer, collecting
the record; another rank taking over from a dead writer) and a rank whose task
has not (its watchdog thread, while the main thread is blocked) both feed the
waiting rule of :mod:`harness.engine.waiting` from the store, as the local pool
feeds it from pipes and files:

- an answer is a rank's posted ``result``; a death is a heartbeat that stopped
  (or a faulthandler report on this node);
- a rank's collectives are what its watchdog posts under ``calls`` while its
  task runs (every quarter second, when they changed);
- a rank's stacks are what it posts under ``silent`` once a ``dump-request``
  is set (at once, not after a grace).

So an exception on one rank that leaves its peers inside a collective, or a
crash inside one, ends the case as soon as the rule proves the peers stuck,
not after ``PEER_GRACE_S``. The deadlock watch's two looks in a row at every
rank's stack are not asked of torchrun's ranks: there a deadlock of every rank
ends at the timeout.
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from typing import Optional

from harness.engine import assemble
from harness.engine.attribution import Observation, attribute
from harness.engine.collectives import recorded
from harness.engine.messages import RankResult, TaskOutcome
from harness.engine.torchrun_protocol import DEAD_AFTER_S, DUMP_GRACE_S, HEARTBEAT_S, POLL_S, CaseKeys
from harness.engine.waiting import PEER_GRACE_S, Look, Probe, Reason, Stop, WaitState
from harness.judge.status import RankStatus, Status
from harness.results.records import Record

# faulthandler's words for fatal signals -> the signal's name
FATAL = {"Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT", "Bus error": "SIGBUS",
         "Floating point exception": "SIGFPE", "Illegal instruction": "SIGILL"}


class JobCase(CaseKeys):
    """One running (case, impl) of the job: its keys in the store, and the waiting rule
    (:mod:`harness.engine.waiting`) fed from them, which says when to stop waiting for the silent ranks."""

    def __init__(self, job, seq: int, case, impl):
        super().__init__(job.store, seq, job.world)
        self.job, self.case, self.impl = job, case, impl
        self.started = time.monotonic()
        self.started_at = assemble.now()
        self.deadline = self.started + job.opts.timeout
        self.returned: Optional[float] = None  # when this rank's task returned
        self.waiting = WaitState(world=job.world, started=self.started, timeout=job.opts.timeout)
        self.reason: Optional[Reason] = None  # why the waiting rule stopped, once it did
        self._posted: Optional[list] = None  # the collectives this rank last posted
        self._stepped = 0.0  # when wait_done last asked the rule
        self._rule = threading.Lock()  # the watchdog and the main thread may both ask it as the task returns

    def wait_done(self, stuck: bool, limit: Optional[float] = None) -> Optional[str]:
        """The writer's word on this case ("continue" or "abort"); None after ``limit`` seconds.

        While waiting, a rank that finds itself the writer (rank 0 is dead and it is the lowest live
        rank) collects once the waiting rule stops, writes the record and ends the job.
        """
        if limit is None:
            limit = self.job.opts.timeout + PEER_GRACE_S + DUMP_GRACE_S + 4 * DEAD_AFTER_S + 30
        end = time.monotonic() + limit
        while time.monotonic() < end:
            done = self.get("done")
            if done is not None:
                return done
            now = time.monotonic()
            waited = stuck
            if not waited and self.returned is not None and now - self._stepped >= HEARTBEAT_S:
                self._stepped = now
                waited = self.step(now) is not None
            if waited and self.job.heartbeats.writer(self.job.rank) == self.job.rank:
                record, _ = self.collect(stuck=stuck)
                self.job._abort_with(self, record)
            time.sleep(POLL_S)
        return None

    def post_calls(self) -> None:
        """Post the collectives this rank has issued in the case so far (when they changed), for the rule."""
        calls = recorded()
        if calls != self._posted:
            self.set("calls", self.job.rank, json.dumps(calls))
            self._posted = calls

    def posted_calls(self, rank: int) -> Optional[list]:
        """What ``rank`` last posted of its collectives in this case (None: nothing yet)."""
        raw = self.get("calls", rank)
        return json.loads(raw) if raw is not None else None

    def observe(self, now: float) -> None:
        """Feed the waiting rule what the store says: results posted, ranks dead without one."""
        state = self.waiting
        if not state.pending:
            return
        results = self.results()
        live = self.job.heartbeats.alive()
        for r in sorted(state.pending):
            if results[r] is not None:
                state.answered(r, RankResult.from_dict(results[r]), now)
            elif r not in live or self.job.fault_report(r):
                state.died(r, now, calls=self.posted_calls(r))

    def step(self, now: float) -> Optional[Reason]:
        """Observe, then follow the waiting rule until it waits (None) or stops (why).

        A stack asked for is a ``silent`` key the rank posts on a dump request: until it is there, the rule
        waits. Two stack dumps in a row, which the deadlock watch needs, are not asked of a rank here: a
        deadlock of every rank under torchrun ends at the timeout.
        """
        with self._rule:
            if self.reason is None:
                self.reason = self._follow(now)
            return self.reason

    def _follow(self, now: float) -> Optional[Reason]:
        self.observe(now)
        while True:
            step = self.waiting.next_step(now)
            if isinstance(step, Stop):
                return step.reason
            if not isinstance(step, Probe):
                self.waiting.waited()
                return None
            if step.look is Look.DEADLOCK:
                self.waiting.saw_deadlock(None, now)
                continue
            for r in step.ranks:
                if step.look is Look.CALLS:
                    self.waiting.saw_calls(r, self.posted_calls(r))
                    continue
                dump = self.get("silent", r)
                if dump is None:
                    self.request_dumps()
                    self.waiting.waited()
                    return None
                self.waiting.saw_stack(r, dump)

    def stuck(self) -> bool:
        """This rank's task has not returned and the waiting rule stopped: the deadline, a failure's grace, or
        the silent ranks (this one among them) provably waiting for good."""
        return self.step(time.monotonic()) not in (None, Reason.ANSWERED)

    def collect(self, stuck: bool) -> tuple[Record, bool]:
        """Gather every rank's result (or stacks, or death), make the record; and whether the job may go on."""
        n = self.job.world
        while not stuck:
            reason = self.step(time.monotonic())
            if reason is Reason.ANSWERED:
                break
            if reason is not None or self.job.terminating:
                stuck = True
                break
            time.sleep(POLL_S)
        if stuck:
            self.request_dumps()
            self._await_dumps()
        results = self.results()
        live = self.job.heartbeats.alive()
        observations = []
        for r in range(n):
            if results[r] is not None:
                observations.append(Observation(rank=r, result=RankResult.from_dict(results[r])))
                continue
            dump = self.get("silent", r)
            report = self.job.fault_report(r)
            if not report and (dump is not None or r in live):
                observations.append(Observation(rank=r, stack_dump=dump or "(alive, but posted no stack dump)",
                                                collectives=self.posted_calls(r)))
                continue
            ob = Observation(rank=r, died=True, stack_dump=report or "the process ended without a result (its exit "
                                                                     "code is in torchrun's report)",
                             collectives=self.posted_calls(r))
            fatal = re.search(r"Fatal Python error: ([A-Za-z ]+)", report)
            if fatal and fatal.group(1).strip() in FATAL:
                ob.exit_code = -signal.Signals[FATAL[fatal.group(1).strip()]].value
            observations.append(ob)
        failed_first = any(o.died or (o.result is not None and o.result.status is RankStatus.ERROR)
                           for o in observations)
        waited = self.waiting.waited_s(self.reason, time.monotonic()) if self.reason else self.job.opts.timeout
        status, outcomes = attribute(observations, failed_first=failed_first, timeout=waited)
        record = assemble.from_outcome(self.case, self.impl, self.job.info, self.job.opts.device,
                                       self.job.opts.resolved_backend,
                                       TaskOutcome(status, outcomes, [o.result for o in observations]),
                                       self.started_at, time.monotonic() - self.started)
        return record, not stuck and status not in (Status.CRASH, Status.HANG)

    def _await_dumps(self) -> None:
        """After a dump request: until every rank without a result posted its stacks or is gone, for at most
        ``DUMP_GRACE_S``."""
        end = time.monotonic() + DUMP_GRACE_S
        while time.monotonic() < end:
            results, live = self.results(), self.job.heartbeats.alive()
            if all(results[r] is not None or self.get("silent", r) is not None or r not in live
                   or self.job.fault_report(r) for r in range(self.job.world)):
                return
            time.sleep(POLL_S)
