"""Running under ``torchrun``: this process is one rank of a (possibly multi-node) job.

Every rank computes the same plan (:mod:`harness.engine.plan`), keeps the
cases whose world size equals the job's, and runs them in the same order
with the same admission (:mod:`harness.engine.admission`: the same
``skipped``/``unsupported`` rules and the same task, ``--compare``
included) and the same rank code as the local pool
(:func:`harness.engine.rank.run_task`). The process group comes from
torchrun's environment (``env://``), whatever rendezvous it used. The
harness's own messages go through the job's key-value store
(:mod:`harness.engine.torchrun_protocol`), never through the process group.

The ranks start each case together (a barrier in the store), so that a peer
that fails early in a case always finds it in flight on every rank. The
writer (rank 0, or the lowest live rank when rank 0 is dead) gathers
every rank's result and writes the record. When a case fails in a way that
leaves a rank stuck (an exception on one rank while its peers wait in a
collective, a crash, a hang past ``--timeout``, or torchrun's SIGTERM after a
worker died), no later case can run on that process group. When to stop
waiting for silent ranks is the local pool's rule too (:mod:`harness.engine.waiting`,
fed from the store by :class:`harness.engine.torchrun_case.JobCase`). Then the
writer's watchdog thread, not its blocked main thread, collects what it can
(results, dumps, which ranks are dead), attributes the failure with the same
rules as the local pool (:mod:`harness.engine.attribution`), appends the
record to the store, prints the run's output, posts ``abort``, and the job
exits 1. A failure is never lost, and nothing waits past ``--timeout`` plus a
few seconds.

A dead rank's exit code is its agent's to know; a rank on the writer's node
leaves its faulthandler output in a file (in a private folder of this job,
removed when the job ends well) the writer reads, so a segfault is named
(SIGSEGV) when it can be.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from harness.engine import admission, assemble, list_contract, logs, nccl_contract
from harness.engine.attribution import stacks_now
from harness.engine.collectives import begin_task, install_recorder
from harness.engine.rank import RankContext, run_task, timedelta, use_inductor_cache
from harness.engine.torchrun_case import JobCase
from harness.engine.torchrun_protocol import DEAD_AFTER_S, DUMP_GRACE_S, HEARTBEAT_S, POLL_S, Heartbeats, exchange
from harness.engine.waiting import PEER_GRACE_S
from harness.results.records import Record

LEAVE_WAIT_S = 15.0  # at the end of a job that went well, how long a rank waits for the others to leave


class Job:
    """This rank's part of a torchrun job over the selected cases (see the module docstring)."""

    def __init__(self, cases: list, impls: list, opts, info, *, resume: bool = False,
                 pairs: Optional[set[tuple[str, str]]] = None):
        self.cases, self.impls, self.opts, self.info = cases, impls, opts, info
        # --resume: the (case, impl) pairs still to run, as the writing rank read them from the store (the
        # other ranks learn them from it at the start, see _pending); None: every pair.
        self.resume, self.pairs = resume, pairs
        self.rank = int(os.environ["RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        self.records: list[Record] = []
        self.store = None
        self.heartbeats: Optional[Heartbeats] = None
        self._lock = threading.Lock()
        self._case: Optional[JobCase] = None
        self._emit: Callable[[Record], None] = lambda r: None
        self._abort: Callable[[list[Record]], None] = lambda rs: None
        self._fault_dir: Optional[Path] = None
        self.terminating = False  # torchrun is stopping the job (SIGTERM): finish the case in flight at once
        self._stop = threading.Event()  # set when every case ran: the helper threads end
        self._threads: list[threading.Thread] = []

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
        elif self.opts.resolved_backend == list_contract.LIST_NAME:
            list_contract.register_list_contract()
        use_inductor_cache()
        dist.init_process_group(self.opts.resolved_backend, init_method="env://",
                                timeout=timedelta(self.opts.timeout + 60))
        try:
            from torch.distributed.distributed_c10d import _get_default_store

            self.store = _get_default_store()
            self.heartbeats = Heartbeats(self.store, self.world)
            self._fault_log()
            self._threads = [threading.Thread(target=self._beat, name="syncbn-heartbeat", daemon=True),
                             threading.Thread(target=self._watchdog, name="syncbn-watchdog", daemon=True)]
            for t in self._threads:
                t.start()
            self._main()
            self._drop_fault_log()  # every case ran: nothing of this job needs the file
            self._stop_threads()
        finally:
            dist.destroy_process_group()
        self._leave_together()
        return self.records

    # ------------------------------------------------------------------ the main thread

    def _main(self) -> None:
        install_recorder()
        ctx = RankContext(self.rank, self.world)
        unavailable = self._exchange_availability()
        for impl in self.impls:
            if impl.name not in unavailable:
                impl.setup_rank(self.opts.device)
        pending = self._pending()
        seq = 0
        for case in [c for c in self.cases if c.world_size == self.world]:
            for impl in self.impls:
                if pending is not None and (case.id, impl.name) not in pending:
                    continue  # --resume: the store holds it already
                refused = admission.refusal(case, impl, self.opts, unavailable, gpus=None, one_backend=True)
                if refused is not None:
                    if self.is_writer:
                        self._finish(assemble.not_run(case, impl, self.info, self.opts.device,
                                                      self.opts.resolved_backend, refused.status, refused.reason))
                    continue
                seq += 1
                c = JobCase(self, seq, case, impl)
                begin_task()  # the last case's collectives must not be posted as this one's (see _watchdog)
                with self._lock:
                    self._case = c
                # Every rank starts the case together: a peer that dies early in it then always finds the case
                # in flight here, and its record is written (torchrun's SIGTERM between cases has nothing to
                # report; a rank slower to get here than its peer to crash once lost the record).
                exchange(self.store, f"start/{seq}", self.rank, self.world, "1", self.opts.timeout + 60)
                result = run_task(ctx, admission.task_for(case, impl, self.opts))
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
        # Every rank waits for every other to finish its cases before any tears down.
        exchange(self.store, "end", self.rank, self.world, "1", self.opts.timeout + 60)

    def _stop_threads(self) -> None:
        """Stop the heartbeat and the watchdog: nothing is in flight, and they must not touch the store as the
        job tears down (a store call failing in a thread at interpreter exit aborts the process)."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout=2 * HEARTBEAT_S + 1)

    def _leave_together(self) -> None:
        """After its process group is destroyed, each rank says so and waits (briefly) for all the others.

        The job's key-value store lives in the agent of the first node, which exits once its own workers
        have: without this, a worker on another node could still be tearing down against a store that is
        gone, and die of it after a job that succeeded.
        """
        try:
            exchange(self.store, "gone", self.rank, self.world, "1", LEAVE_WAIT_S)
        except Exception:  # noqa: BLE001 - a peer already gone with the store: nothing left to wait for
            pass

    def _pending(self) -> Optional[set[tuple[str, str]]]:
        """With --resume, the pairs to run: the writing rank's (it read the store), the same on every rank."""
        if not self.resume:
            return None
        mine = json.dumps(sorted(self.pairs) if self.pairs is not None else None) if self.is_writer else "null"
        posted = exchange(self.store, "pending", self.rank, self.world, mine, self.opts.timeout + 60)[0]
        decoded = json.loads(posted)
        return None if decoded is None else {(case, impl) for case, impl in decoded}

    def _exchange_availability(self) -> dict[str, str]:
        """Implementations any rank cannot run are skipped on every rank (with that rank's reason)."""
        mine = admission.unavailable(self.impls, self.opts.device, self.info.cuda_available)
        if self.world > 1:
            mine = {name: f"rank {self.rank}: {why}" for name, why in mine.items()}
        union: dict[str, str] = {}
        for posted in exchange(self.store, "avail", self.rank, self.world, json.dumps(mine), self.opts.timeout + 60):
            for name, why in json.loads(posted).items():
                union.setdefault(name, why)
        return union

    def _finish(self, record: Record) -> None:
        with self._lock:
            self.records.append(record)
            self._emit(record)

    def _abort_with(self, c: "JobCase", record: Record) -> None:
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
        while not self._stop.is_set():
            try:
                self.heartbeats.beat(self.rank)
                self.heartbeats.alive()
            except Exception:  # noqa: BLE001 - the job's store is gone (the agent died): nothing to report to
                os._exit(1)
            time.sleep(HEARTBEAT_S)

    def _watchdog(self) -> None:
        """Act for the main thread when it cannot: past the deadline, after a peer's failure, on SIGTERM."""
        while not self._stop.is_set():
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
                if c.get("done") == "abort":
                    os._exit(1)  # the case's record is written and the job ends: nothing waits for our task
                c.post_calls()
                if c.get("dump-request") is not None and c.get("silent", self.rank) is None:
                    c.set("silent", self.rank, stacks_now())  # a collecting rank asked to see where we are
                if terminated or c.stuck():
                    c.set("silent", self.rank, stacks_now())
                    c.request_dumps()
                    c.wait_done(stuck=True, limit=PEER_GRACE_S + DUMP_GRACE_S + 4 * DEAD_AFTER_S + 10)
                    os._exit(1)
            except Exception:  # noqa: BLE001 - the job's store is gone (the agent died): nothing to report to
                os._exit(1)

    def _fault_log(self) -> None:
        """faulthandler writes a crash's report to a file per rank, which a writer on this node can read."""
        # One folder per job and node: the ranks of a node share their agent (their parent process), and two
        # jobs on one machine may share a run id (c10d's default is "none").
        # The agent's pid and start time name it uniquely on this host, whatever run id jobs share, and a later
        # job never reuses an earlier one's folder (its crash reports are kept) even when a pid comes round again.
        job = f"{os.environ.get('TORCHELASTIC_RUN_ID', 'job')}-agent{os.getppid()}-{logs.start_time(os.getppid())}"
        self._fault_dir = logs.torchrun_folder(job)
        # O_EXCL|O_NOFOLLOW: a file (or a link) already there is never written through.
        fd = os.open(self._fault_dir / f"rank{self.rank}.fault", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                     0o600)
        self._fault_file = os.fdopen(fd, "w")
        faulthandler.enable(file=self._fault_file, all_threads=True)

    def _drop_fault_log(self) -> None:
        """Stop faulthandler writing to our file and remove it (and the node's folder, once empty)."""
        faulthandler.disable()
        self._fault_file.close()
        for remove in (lambda: (self._fault_dir / f"rank{self.rank}.fault").unlink(), self._fault_dir.rmdir):
            try:
                remove()
            except OSError:
                pass  # a peer on this node still has its file: the last one out removes the folder

    def fault_report(self, rank: int) -> str:
        """What faulthandler wrote for ``rank`` on this node ('' if it is on another node or wrote nothing)."""
        try:
            return (self._fault_dir / f"rank{rank}.fault").read_text(errors="replace")[-6000:]
        except OSError:
            return ""
