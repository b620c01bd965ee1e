"""Running under ``torchrun``: this process is one rank of a (possibly multi-node) job.

Every rank computes the same selection, keeps the cases whose world size
equals the job's, and runs them in the same order with the same rank code as
the local pool (:func:`harness.engine.rank.run_task`). The process group
comes from torchrun's environment (``env://``), whatever rendezvous it used.

The harness's own messages go through the job's key-value store (the one
``init_process_group`` joined), never through the process group: a rank
stuck in the implementation's collective cannot block them. Keys live under
``syncbn-harness/<case number>/``:

    result/<r>      rank r's RankResult (JSON), posted when its task returns
    silent/<r>      rank r's stack dump, posted by its watchdog while its task does not return
    dump-request    a failure was seen: every rank whose task has not returned posts silent/<r>
    done            "continue" (the next case may start) or "abort" (the job ends)

and ``syncbn-harness/heartbeat/<r>``, a counter every rank's watchdog thread
bumps four times a second: a counter that stops moving is a dead process.

The writer (rank 0, or the lowest live rank when rank 0 is dead) gathers
every rank's result and writes the record. When a case fails in a way that
leaves a rank stuck (an exception on one rank while its peers wait in a
collective, a crash, a hang past ``--timeout``, or torchrun's SIGTERM after a
worker died), no later case can run on that process group. Then the
writer's watchdog thread, not its blocked main thread, collects what it can
(results, dumps, which ranks are dead), attributes the failure with the same
rules as the local pool (:mod:`harness.engine.attribution`), appends the
record to the store, prints the run's output, posts ``abort``, and the job
exits 1. A failure is never lost, and nothing waits past ``--timeout`` plus a
few seconds.

A dead rank's exit code is its agent's to know; a rank on the writer's node
leaves its faulthandler output in a file the writer reads, so a segfault is
named (SIGSEGV) when it can be.
"""

from __future__ import annotations

import faulthandler
import json
import os
import re
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from harness.engine import assemble
from harness.engine.attribution import Observation, attribute, stacks_now
from harness.engine import nccl_contract
from harness.engine.collectives import install_recorder
from harness.engine.messages import RankResult, Task
from harness.engine.rank import RankContext, run_task, timedelta, use_inductor_cache
from harness.errors import ImplUnavailable
from harness.results.records import RankStatus, Record, Status
from harness.scenarios import unsupported_reason as scenario_unsupported

PREFIX = "syncbn-harness/"
HEARTBEAT_S = 0.25
DEAD_AFTER_S = 1.5  # a heartbeat unchanged this long: the process is gone
PEER_GRACE_S = 3.0  # after a failure, how long the others get to answer
DUMP_GRACE_S = 2.5  # after a dump request, how long ranks get to post their stacks
POLL_S = 0.05
# faulthandler's words for fatal signals -> the signal's name
FATAL = {"Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT", "Bus error": "SIGBUS",
         "Floating point exception": "SIGFPE", "Illegal instruction": "SIGILL"}


def under_torchrun() -> bool:
    """Whether this process was started by torchrun (torch.distributed.run)."""
    env = os.environ
    return "TORCHELASTIC_RUN_ID" in env and "RANK" in env and "WORLD_SIZE" in env


class Heartbeats:
    """Every rank's heartbeat counter in the store, and when each last moved (as seen from here)."""

    def __init__(self, store, world: int):
        self.store, self.world = store, world
        start = time.monotonic()
        self._seen = {r: (None, start) for r in range(world)}
        self._lock = threading.Lock()

    def beat(self, rank: int) -> None:
        self.store.add(f"{PREFIX}heartbeat/{rank}", 1)

    def alive(self) -> set[int]:
        """Ranks whose counter moved within ``DEAD_AFTER_S`` (a rank not yet seen long enough counts as alive)."""
        now = time.monotonic()
        with self._lock:
            for r in range(self.world):
                value = self.store.add(f"{PREFIX}heartbeat/{r}", 0)
                if value != self._seen[r][0]:
                    self._seen[r] = (value, now)
            return {r for r, (_, moved) in self._seen.items() if now - moved < DEAD_AFTER_S}

    def writer(self, me: int) -> int:
        """Rank 0 while it lives, else the lowest live rank."""
        live = self.alive() | {me}
        return 0 if 0 in live else min(live)



def fixed_backend(case, run_backend: str) -> Optional[str]:
    """Why a case that names its own backend cannot run in this job (None: it can)."""
    if case.backend_for(run_backend) != run_backend:
        return (f"the case runs over {case.backend}, and a torchrun job has one backend ({run_backend}): run it "
                f"with --backend {case.backend}, or without torchrun")
    return None

class Job:
    """This rank's part of a torchrun job over the selected cases (see the module docstring)."""

    def __init__(self, cases: list, impls: list, opts, info):
        self.cases, self.impls, self.opts, self.info = cases, impls, opts, info
        self.rank = int(os.environ["RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        self.records: list[Record] = []
        self.store = None
        self.heartbeats: Optional[Heartbeats] = None
        self._lock = threading.Lock()
        self._case: Optional[_Case] = None
        self._emit: Callable[[Record], None] = lambda r: None
        self._abort: Callable[[list[Record]], None] = lambda rs: None
        self._fault_dir: Optional[Path] = None
        self.terminating = False  # torchrun is stopping the job (SIGTERM): finish the case in flight at once

    @property
    def is_writer(self) -> bool:
        return self.rank == 0

    def run(self, on_record: Callable[[Record], None], on_abort: Callable[[list[Record]], None]) -> list[Record]:
        """Run this rank's part; the writer calls ``on_record`` per record (``on_abort`` before an abort exit)."""
        import torch.distributed as dist

        self._emit, self._abort = on_record, on_abort
        # SIGTERM (torchrun stopping the job after a worker died) is taken by the watchdog thread, which can
        # act while the main thread is blocked inside a collective; threads started from here inherit the mask.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        if self.opts.resolved_backend == nccl_contract.NAME:
            nccl_contract.register()
        use_inductor_cache()
        dist.init_process_group(self.opts.resolved_backend, init_method="env://",
                                timeout=timedelta(self.opts.timeout + 60))
        try:
            from torch.distributed.distributed_c10d import _get_default_store

            self.store = _get_default_store()
            self.heartbeats = Heartbeats(self.store, self.world)
            self._fault_log()
            threading.Thread(target=self._beat, name="syncbn-heartbeat", daemon=True).start()
            threading.Thread(target=self._watchdog, name="syncbn-watchdog", daemon=True).start()
            self._main()
        finally:
            dist.destroy_process_group()
        return self.records

    # ------------------------------------------------------------------ the main thread

    def _main(self) -> None:
        install_recorder()
        ctx = RankContext(self.rank, self.world)
        unavailable = self._exchange_availability()
        for impl in self.impls:
            if impl.name not in unavailable:
                impl.setup_rank(self.opts.device)
        seq = 0
        for case in [c for c in self.cases if c.world_size == self.world]:
            for impl in self.impls:
                reason, status = unavailable.get(impl.name), Status.SKIPPED
                if reason is None:
                    reason = impl.unsupported_reason(case, self.opts.device) or scenario_unsupported(
                        case, impl, self.opts.device, self.opts.resolved_backend) or fixed_backend(
                        case, self.opts.resolved_backend)
                    status = Status.UNSUPPORTED
                if reason:
                    if self.is_writer:
                        self._finish(assemble.not_run(case, impl, self.info, self.opts.device,
                                                      self.opts.resolved_backend, status, reason))
                    continue
                seq += 1
                c = _Case(self, seq, case, impl)
                with self._lock:
                    self._case = c
                result = run_task(ctx, Task(case=case.to_dict(), impl=impl.key, device=self.opts.device))
                c.set("result", self.rank, json.dumps(result.to_dict()))
                c.returned = time.monotonic()
                if self.is_writer:
                    record, proceed = c.collect(stuck=False)
                    if not proceed:
                        self._abort_with(c, record)
                    self._finish(record)
                    c.set_done("continue")
                elif c.wait_done(stuck=False) != "continue":
                    os._exit(1)
                with self._lock:
                    self._case = None
        self.store.set(f"{PREFIX}end/{self.rank}", "1")
        if self.is_writer:
            self.store.wait([f"{PREFIX}end/{r}" for r in range(self.world)], timedelta(self.opts.timeout + 60))

    def _exchange_availability(self) -> dict[str, str]:
        """Implementations any rank cannot run are skipped on every rank (with that rank's reason)."""
        mine = {}
        for impl in self.impls:
            try:
                impl.check_available_on(self.opts.device)
            except ImplUnavailable as exc:
                mine[impl.name] = f"rank {self.rank}: {exc}" if self.world > 1 else str(exc)
        self.store.set(f"{PREFIX}avail/{self.rank}", json.dumps(mine))
        keys = [f"{PREFIX}avail/{r}" for r in range(self.world)]
        self.store.wait(keys, timedelta(self.opts.timeout + 60))
        union: dict[str, str] = {}
        for key in keys:
            for name, why in json.loads(self.store.get(key)).items():
                union.setdefault(name, why)
        return union

    def _finish(self, record: Record) -> None:
        with self._lock:
            self.records.append(record)
            self._emit(record)

    def _abort_with(self, c: "_Case", record: Record) -> None:
        """Write the failing record, print the run's output, tell every rank to stop, exit 1.

        Two threads of the writer (the main one and the watchdog, when torchrun's SIGTERM comes while
        the main thread writes) or two ranks (rank 0 leaving, the next one taking over) may both get
        here: the first to claim the case in the store writes its one record; the others wait for its
        word before they leave.
        """
        if c.claim_record():
            self._finish(record)
            with self._lock:
                self._abort(list(self.records))
            c.set_done("abort")
        else:
            end = time.monotonic() + DUMP_GRACE_S + 2 * DEAD_AFTER_S + 5
            while c.get("done") is None and time.monotonic() < end:
                time.sleep(POLL_S)
        os._exit(1)

    # ------------------------------------------------------------------ the watchdog thread

    def _beat(self) -> None:
        """Bump our heartbeat and watch everyone's, four times a second, whatever the other threads do."""
        while True:
            try:
                self.heartbeats.beat(self.rank)
                self.heartbeats.alive()
            except Exception:  # noqa: BLE001 - the job's store is gone (the agent died): nothing to report to
                os._exit(1)
            time.sleep(HEARTBEAT_S)

    def _watchdog(self) -> None:
        """Act for the main thread when it cannot: past the deadline, after a peer's failure, on SIGTERM."""
        while True:
            try:
                terminated = signal.sigtimedwait({signal.SIGTERM}, HEARTBEAT_S) is not None
                with self._lock:
                    c = self._case
                if terminated:
                    self.terminating = True
                if c is None:
                    if terminated:
                        os._exit(1)  # between cases: nothing of ours is in flight
                    continue
                if c.returned:
                    if terminated:  # the main thread finishes the case (quickly now); then, or anyway, leave
                        time.sleep(PEER_GRACE_S + DUMP_GRACE_S + 2 * DEAD_AFTER_S + 5)
                        os._exit(1)
                    continue
                if terminated or c.stuck():
                    c.set("silent", self.rank, stacks_now())
                    c.request_dumps()
                    c.wait_done(stuck=True, limit=PEER_GRACE_S + DUMP_GRACE_S + 4 * DEAD_AFTER_S + 10)
                    os._exit(1)
            except Exception:  # noqa: BLE001 - the job's store is gone (the agent died): nothing to report to
                os._exit(1)

    def _fault_log(self) -> None:
        """faulthandler writes a crash's report to a file per rank, which a writer on this node can read."""
        self._fault_dir = Path(tempfile.gettempdir()) / f"syncbn-harness-{os.environ.get('TORCHELASTIC_RUN_ID', 'job')}"
        self._fault_dir.mkdir(parents=True, exist_ok=True)
        self._fault_file = open(self._fault_dir / f"rank{self.rank}.fault", "w")
        faulthandler.enable(file=self._fault_file, all_threads=True)

    def fault_report(self, rank: int) -> str:
        """What faulthandler wrote for ``rank`` on this node ('' if it is on another node or wrote nothing)."""
        try:
            return (self._fault_dir / f"rank{rank}.fault").read_text(errors="replace")[-6000:]
        except OSError:
            return ""


class _Case:
    """One running (case, impl) of the job: its keys in the store and the rules for collecting them."""

    def __init__(self, job: Job, seq: int, case, impl):
        self.job, self.seq, self.case, self.impl = job, seq, case, impl
        self.prefix = f"{PREFIX}{seq}/"
        self.started = time.monotonic()
        self.started_at = assemble.now()
        self.deadline = self.started + job.opts.timeout
        self.returned: Optional[float] = None  # when this rank's task returned
        self.failure_seen: Optional[float] = None

    def _key(self, what: str, rank: Optional[int] = None) -> str:
        return self.prefix + what + ("" if rank is None else f"/{rank}")

    def claim_record(self) -> bool:
        """True for the first caller, in the whole job, to write this case's record."""
        return self.job.store.add(self._key("written"), 1) == 1

    def set(self, what: str, rank: int, value: str) -> None:
        self.job.store.set(self._key(what, rank), value)

    def get(self, what: str, rank: Optional[int] = None) -> Optional[str]:
        key = self._key(what, rank)
        if not self.job.store.check([key]):
            return None
        return self.job.store.get(key).decode()

    def set_done(self, value: str) -> None:
        self.job.store.set(self._key("done"), value)

    def request_dumps(self) -> None:
        self.job.store.set(self._key("dump-request"), "1")

    def results(self) -> dict[int, Optional[dict]]:
        return {r: (json.loads(raw) if (raw := self.get("result", r)) is not None else None)
                for r in range(self.job.world)}

    def wait_done(self, stuck: bool, limit: Optional[float] = None) -> Optional[str]:
        """The writer's word on this case ("continue" or "abort"); None after ``limit`` seconds.

        While waiting, a rank that finds itself the writer (rank 0 is dead and it is the lowest live
        rank) collects, writes the record and ends the job.
        """
        if limit is None:
            limit = self.job.opts.timeout + PEER_GRACE_S + DUMP_GRACE_S + 4 * DEAD_AFTER_S + 30
        end = time.monotonic() + limit
        while time.monotonic() < end:
            done = self.get("done")
            if done is not None:
                return done
            waited = stuck or (self.returned is not None and time.monotonic() - self.returned > PEER_GRACE_S)
            if waited and self.job.heartbeats.writer(self.job.rank) == self.job.rank:
                record, _ = self.collect(stuck=stuck)
                self.job._abort_with(self, record)
            time.sleep(POLL_S)
        return None

    def stuck(self) -> bool:
        """This rank's task is past its deadline, or a peer failed and we have not returned within the grace."""
        now = time.monotonic()
        if now >= self.deadline:
            return True
        if self.failure_seen is None and (self.get("dump-request") is not None or any(
                r is not None and r.get("status") == RankStatus.ERROR.value for r in self.results().values())):
            self.failure_seen = now
        return self.failure_seen is not None and now - self.failure_seen >= PEER_GRACE_S

    def collect(self, stuck: bool) -> tuple[Record, bool]:
        """Gather every rank's result (or stacks, or death), make the record; and whether the job may go on."""
        n = self.job.world
        failure_at: Optional[float] = None
        while not stuck:
            results = self.results()
            if all(r is not None for r in results.values()):
                break
            now = time.monotonic()
            dead = set(range(n)) - self.job.heartbeats.alive()
            if failure_at is None and (dead - {r for r, v in results.items() if v is not None} or any(
                    v is not None and v.get("status") == RankStatus.ERROR.value for v in results.values())):
                failure_at = now
            if now >= self.deadline or self.job.terminating or (failure_at is not None
                                                                 and now - failure_at >= PEER_GRACE_S):
                stuck = True
                break
            time.sleep(POLL_S)
        if stuck:
            self.request_dumps()
            time.sleep(DUMP_GRACE_S)
        results = self.results()
        live = self.job.heartbeats.alive()
        observations = []
        for r in range(n):
            if results[r] is not None:
                observations.append(Observation(rank=r, result=RankResult.from_dict(results[r])))
                continue
            dump = self.get("silent", r)
            if dump is not None or r in live:
                observations.append(Observation(rank=r, stack_dump=dump or "(alive, but posted no stack dump)"))
                continue
            report = self.job.fault_report(r)
            ob = Observation(rank=r, died=True, stack_dump=report or "the process ended without a result (its exit "
                                                                     "code is in torchrun's report)")
            fatal = re.search(r"Fatal Python error: ([A-Za-z ]+)", report)
            if fatal and fatal.group(1).strip() in FATAL:
                ob.exit_code = -signal.Signals[FATAL[fatal.group(1).strip()]].value
            observations.append(ob)
        failed_first = any(o.died or (o.result is not None and o.result.status is RankStatus.ERROR)
                           for o in observations)
        status, outcomes = attribute(observations, failed_first=failed_first, timeout=self.job.opts.timeout)
        record = assemble.from_outcome(self.case, self.impl, self.job.info, self.job.opts.device,
                                       self.job.opts.resolved_backend,
                                       _Outcome(status, outcomes, [o.result for o in observations]),
                                       self.started_at, time.monotonic() - self.started)
        return record, not stuck and status not in (Status.CRASH, Status.HANG)


class _Outcome:
    """The shape :func:`harness.engine.assemble.from_outcome` reads (as the pool's TaskOutcome)."""

    def __init__(self, status, ranks, results):
        self.status, self.ranks, self.results = status, ranks, results
