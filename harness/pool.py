"""Warm pool of rank processes running a stream of cases over one process group.

Protocol, parent <-> rank r, one duplex pipe per rank, plain dicts only:

    rank -> parent  {"op": "ready"}                    once its process group is up
                    {"op": "failed", ...}              if it could not start
    parent -> rank  {"op": "run", "task": {...}}       one task (harness.worker.run_task)
    rank -> parent  {"op": "result", "result": {...}}  its outcome of that task
    parent -> rank  {"op": "stop"}                     leave cleanly

Rendezvous: the parent hosts a ``TCPStore`` on port 0, so the OS picks a free
port and two pools (two runs, xdist workers) never collide; ranks join it by
port. No ``MASTER_ADDR``/``MASTER_PORT``/``RANK``/``WORLD_SIZE`` from the
caller's environment reaches a rank.

Attribution of one task (:meth:`Pool.run`): the parent waits on every rank's
pipe and process sentinel until all have answered or ``timeout`` expires.
- a rank whose process ends: ``crash`` (signal name or exit code);
- a rank that answers with an exception: ``error``;
- after a first failure, siblings get ``PEER_GRACE_S`` to answer; those still
  waiting inside a torch.distributed call are ``peer-failed``, not blamed;
- at the timeout, every silent rank's Python stack is dumped (faulthandler on
  SIGUSR1, into its log). Ranks stuck in a collective are ``peer-failed``;
  the others (stuck elsewhere, or that returned while peers wait in a
  collective they skipped) are the ``hang``.
After any failure the pool is torn down (every child reaped) and restarted
lazily for the next task.

Orphans: ranks ignore SIGINT (the parent handles Ctrl-C and kills them), ask
the kernel for SIGKILL when the parent dies (PR_SET_PDEATHSIG) and also poll
their parent id, so a SIGKILLed harness leaves no rank behind for more than a
second or two.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path
from typing import Optional

from harness.errors import HarnessError
from harness.records import PEER_FAILED, RankOutcome, Status

log = logging.getLogger(__name__)

START_TIMEOUT_S = 180.0  # spawn + import torch + init_process_group (+ a kernel build on first use)
PEER_GRACE_S = 3.0
DUMP_WAIT_S = 2.0
STOP_WAIT_S = 5.0
SCRUBBED_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")
COLLECTIVE_MARKERS = ("torch/distributed/", "distributed_c10d.py")


class PoolStartError(HarnessError):
    """No rank could start (exit 3)."""


@dataclass
class TaskOutcome:
    """What every rank did with one task."""

    status: Status
    ranks: list[RankOutcome]
    results: list[Optional[dict]]  # each rank's result dict, None when it gave none
    pool_broken: bool


class Pool:
    """``world_size`` rank processes started once; :meth:`run` sends them one task at a time."""

    def __init__(self, world_size: int, *, backend: str = "gloo", device: str = "cpu",
                 setup_impls: tuple[str, ...] = (), start_timeout: float = START_TIMEOUT_S):
        self.world_size = world_size
        self.backend = backend
        self.device = device
        self.setup_impls = setup_impls
        self.start_timeout = start_timeout
        self.procs: list = []
        self.conns: list = []
        self.logdir: Optional[Path] = None
        self._store = None
        self.starts = 0

    # ------------------------------------------------------------------ lifecycle

    @property
    def alive(self) -> bool:
        return bool(self.procs)

    def start(self) -> None:
        """Spawn the ranks and wait until every one has joined the process group."""
        import torch.distributed as dist

        self.close()
        self.starts += 1
        self.logdir = Path(tempfile.mkdtemp(prefix=f"syncbn-pool-ws{self.world_size}-"))
        self._store = dist.TCPStore("127.0.0.1", 0, self.world_size + 1, True, wait_for_workers=False,
                                    timeout=_timedelta(self.start_timeout))
        port = self._store.port
        ctx = mp.get_context("spawn")
        try:
            for rank in range(self.world_size):
                parent_end, child_end = ctx.Pipe(duplex=True)
                proc = ctx.Process(
                    target=_rank_main,
                    args=(rank, self.world_size, port, child_end, str(self.logdir / f"rank{rank}.log"),
                          os.getpid(), self.backend, self.device, self.setup_impls),
                    name=f"syncbn-rank{rank}", daemon=True)
                proc.start()
                child_end.close()
                self.procs.append(proc)
                self.conns.append(parent_end)
            self._await_ready()
        except BaseException:
            self.close()
            raise

    def _await_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        pending = set(range(self.world_size))
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise PoolStartError(f"ranks {sorted(pending)} did not join the process group within "
                                     f"{self.start_timeout:.0f}s; see {self.logdir}")
            ready = wait([self.conns[r] for r in pending] + [self.procs[r].sentinel for r in pending],
                         timeout=remaining)
            for obj in ready:
                r = self._rank_of(obj)
                if r not in pending:
                    continue
                msg = self._recv(r)
                if msg is None:
                    code = self.procs[r].exitcode
                    raise PoolStartError(f"rank {r} died while starting ({_describe_exit(code)}):\n"
                                         f"{self.log_tail(r)}")
                if msg.get("op") == "failed":
                    raise PoolStartError(f"rank {r} could not start: {msg.get('message')}\n{msg.get('traceback', '')}")
                pending.discard(r)

    def close(self) -> None:
        """Stop every rank: politely, then SIGKILL; reap them all."""
        for conn in self.conns:
            try:
                conn.send({"op": "stop"})
            except (OSError, ValueError, BrokenPipeError):
                pass
        deadline = time.monotonic() + STOP_WAIT_S
        for proc in self.procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
        for proc in self.procs:
            proc.join(timeout=STOP_WAIT_S)
        for conn in self.conns:
            conn.close()
        self.procs, self.conns = [], []
        self._store = None

    def kill(self) -> None:
        """Tear down at once (after a failure, or on Ctrl-C)."""
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
        for proc in self.procs:
            proc.join(timeout=STOP_WAIT_S)
        for conn in self.conns:
            conn.close()
        self.procs, self.conns = [], []
        self._store = None

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    # ------------------------------------------------------------------ one task

    def run(self, task: dict, timeout: float) -> TaskOutcome:
        """Send ``task`` to every rank and attribute what each did (see the module docstring)."""
        if not self.alive:
            self.start()
        for conn in self.conns:
            try:
                conn.send({"op": "run", "task": task})
            except (OSError, BrokenPipeError):
                pass  # the rank is dead; its sentinel says so below
        n = self.world_size
        results: list[Optional[dict]] = [None] * n
        outcomes: list[Optional[RankOutcome]] = [None] * n
        pending = set(range(n))
        deadline = time.monotonic() + timeout
        first_failure: Optional[float] = None
        while pending:
            now = time.monotonic()
            limit = deadline if first_failure is None else min(deadline, first_failure + PEER_GRACE_S)
            if now >= limit:
                break
            ready = wait([self.conns[r] for r in pending] + [self.procs[r].sentinel for r in pending],
                         timeout=limit - now)
            for obj in ready:
                r = self._rank_of(obj)
                if r not in pending:
                    continue
                msg = self._recv(r)
                if msg is None:  # the process is gone
                    self.procs[r].join(timeout=STOP_WAIT_S)
                    code = self.procs[r].exitcode
                    outcomes[r] = RankOutcome(rank=r, status=Status.CRASH.value, exit_code=code,
                                              signal=_signal_name(code), message=_describe_exit(code),
                                              stack_dump=self.log_tail(r))
                    first_failure = first_failure or time.monotonic()
                else:
                    res = msg.get("result", {})
                    results[r] = res
                    status = res.get("status", "error")
                    outcomes[r] = RankOutcome(rank=r, status=status, exception_type=res.get("exception_type"),
                                              message=res.get("message", ""), traceback=res.get("traceback"))
                    if status == Status.ERROR.value:
                        first_failure = first_failure or time.monotonic()
                pending.discard(r)
        timed_out = bool(pending) and first_failure is None
        dumps = {r: self.dump_stack(r) for r in sorted(pending)}
        for r in pending:
            in_collective = _in_collective(dumps[r])
            outcomes[r] = RankOutcome(rank=r, status=Status.HANG.value, stack_dump=dumps[r],
                                      message=f"no answer within {timeout:g}s")
            if first_failure is not None or in_collective:
                outcomes[r].status = PEER_FAILED
                outcomes[r].message = ("waiting in a collective for a rank that failed" if first_failure
                                       else "waiting in a collective its peers did not enter")
        if timed_out:
            self._blame_hang(outcomes, pending, dumps, timeout)
        # Errors inside torch.distributed after a sibling crashed are the sibling's doing.
        crashed = any(o.status == Status.CRASH.value for o in outcomes)
        for o in outcomes:
            if crashed and o.status == Status.ERROR.value and o.traceback and \
                    any(m in o.traceback for m in COLLECTIVE_MARKERS):
                o.status = PEER_FAILED
                o.message = f"collective failed after a sibling crashed: {o.message}"
        status = _overall(outcomes, timed_out)
        broken = status in (Status.ERROR, Status.CRASH, Status.HANG) or any(
            o.status in (Status.ERROR.value, Status.CRASH.value, PEER_FAILED) for o in outcomes)
        if broken:
            self.kill()
        return TaskOutcome(status=status, ranks=list(outcomes), results=results, pool_broken=broken)

    def _blame_hang(self, outcomes, pending, dumps, timeout) -> None:
        stuck_elsewhere = [r for r in pending if not _in_collective(dumps[r])]
        if stuck_elsewhere:
            for r in pending:
                if r not in stuck_elsewhere:
                    outcomes[r].message = f"waiting in a collective for ranks {sorted(stuck_elsewhere)}"
            return  # those ranks keep status hang; the ones in collectives wait for them
        finished = [o.rank for o in outcomes if o.rank not in pending]
        if finished:
            # Everyone still silent waits in a collective that the finished ranks never entered.
            for r in finished:
                outcomes[r].status = Status.HANG.value
                outcomes[r].message = (f"returned while ranks {sorted(pending)} waited {timeout:g}s in a "
                                       "collective this rank did not enter")
        else:
            # All ranks are inside collectives (mismatched collectives): none can be singled out.
            for r in pending:
                outcomes[r].status = Status.HANG.value
                outcomes[r].message = f"deadlocked in a collective for {timeout:g}s"

    # ------------------------------------------------------------------ helpers

    def _rank_of(self, obj) -> int:
        for r in range(len(self.procs)):
            if obj is self.conns[r] or obj == self.procs[r].sentinel:
                return r
        raise KeyError(obj)

    def _recv(self, r: int) -> Optional[dict]:
        conn = self.conns[r]
        try:
            if conn.poll(0):
                return conn.recv()
        except (EOFError, OSError, ConnectionResetError):
            return None
        if not self.procs[r].is_alive():
            return None
        # The sentinel fired but the pipe is empty: the process is exiting.
        self.procs[r].join(timeout=STOP_WAIT_S)
        return None

    def dump_stack(self, r: int) -> str:
        """Ask rank ``r`` for its Python stacks (faulthandler) and return what it wrote."""
        proc = self.procs[r]
        path = self.logdir / f"rank{r}.log"
        before = path.stat().st_size if path.exists() else 0
        if not proc.is_alive():
            return self.log_tail(r)
        try:
            os.kill(proc.pid, signal.SIGUSR1)
        except ProcessLookupError:
            return self.log_tail(r)
        deadline = time.monotonic() + DUMP_WAIT_S
        text = ""
        while time.monotonic() < deadline:
            time.sleep(0.05)
            text = _read_from(path, before)
            if "most recent call first" in text:
                time.sleep(0.2)  # let faulthandler finish writing every thread
                text = _read_from(path, before)
                break
        return text[-6000:]

    def log_tail(self, r: int, limit: int = 6000) -> str:
        if self.logdir is None:
            return ""
        return _read_from(self.logdir / f"rank{r}.log", 0)[-limit:]


def _in_collective(dump: str) -> bool:
    """Whether the main thread of a faulthandler dump is inside a torch.distributed call."""
    main = dump.split("Current thread", 1)[1] if "Current thread" in dump else dump
    main = main.split("\n\n", 1)[0]
    return any(m in main for m in COLLECTIVE_MARKERS)


def _read_from(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _overall(outcomes: list[RankOutcome], timed_out: bool) -> Status:
    statuses = [o.status for o in outcomes]
    for s in (Status.CRASH, Status.HANG, Status.ERROR):
        if s.value in statuses:
            return s
    if timed_out:
        return Status.HANG
    if Status.MISMATCH.value in statuses:
        return Status.MISMATCH
    if PEER_FAILED in statuses:
        return Status.ERROR
    return Status.PASS


def _signal_name(code: Optional[int]) -> Optional[str]:
    if code is not None and code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return None


def _describe_exit(code: Optional[int]) -> str:
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by {_signal_name(code)}"
    return f"exited with code {code}"


def _timedelta(seconds: float):
    import datetime

    return datetime.timedelta(seconds=seconds)


# ---------------------------------------------------------------------- rank side


def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when the parent dies: prctl where available, and a polling thread."""
    import ctypes
    import threading

    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    if os.getppid() != parent_pid:
        os._exit(70)

    def watch():
        while True:
            if os.getppid() != parent_pid:
                os._exit(70)
            time.sleep(0.5)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _rank_main(rank: int, world_size: int, port: int, conn, log_path: str, parent_pid: int, backend: str,
               device: str, setup_impls: tuple) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(parent_pid)
    for var in SCRUBBED_ENV:
        os.environ.pop(var, None)
    # Everything the rank prints, Python or C++, goes to its log (read for crash and hang reports).
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    import faulthandler
    import sys

    logfile = open(log_path, "a", buffering=1)
    sys.stdout = sys.stderr = logfile
    faulthandler.enable(file=logfile, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=logfile, all_threads=True)
    logging.basicConfig(level=logging.INFO, stream=logfile,
                        format=f"%(asctime)s rank{rank} %(name)s %(levelname)s %(message)s")
    try:
        import torch.distributed as dist

        from harness.worker import RankContext, run_task

        store = dist.TCPStore("127.0.0.1", port, world_size + 1, False, timeout=_timedelta(START_TIMEOUT_S))
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=_timedelta(START_TIMEOUT_S))
        ctx = RankContext(rank, world_size)
        for key in setup_impls:
            ctx.impl(key, device)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent as data
        import traceback

        conn.send({"op": "failed", "message": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
        os._exit(1)
    conn.send({"op": "ready"})
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        if msg.get("op") == "stop":
            break
        if msg.get("op") == "run":
            conn.send({"op": "result", "result": run_task(ctx, msg["task"])})
    try:
        dist.destroy_process_group()
    finally:
        logfile.flush()
        os._exit(0)
