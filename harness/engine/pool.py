"""The parent side of a warm pool: ``world_size`` rank processes over one process group, one task at a time.

The pipe protocol and the rank's loop are in :mod:`harness.engine.rank`.

Rendezvous: the parent hosts a ``TCPStore`` on port 0, so the OS picks a free
port and two pools (two runs, xdist workers) never collide; ranks join it by
port and rank number, never through the caller's environment.

One task (:meth:`Pool.run`): the parent sends it to every rank, then gathers what it sees (answers on
the pipes, deaths on the process sentinels, collectives from each rank's ``rank<r>.calls`` file, stacks
dumped by faulthandler on SIGUSR1 into the rank's log) for the waiting rule of
:mod:`harness.engine.waiting` and does what it says; :func:`harness.engine.attribution.attribute` then
decides who is to blame. After a failure the pool is torn down (every child killed and reaped): a rank
left inside a collective cannot take another task. The exception: a failure that provably left nothing
in flight (:mod:`harness.engine.reuse`) keeps the pool, whose next task runs as on a fresh one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import shutil
import tempfile
import threading
import time
from multiprocessing.connection import wait
from pathlib import Path
from typing import Optional

from harness.engine import logs
from harness.engine.attribution import attribute, describe_exit
from harness.engine.collectives import read_sink
from harness.engine.forkserver import start_context
from harness.engine.messages import RankResult, Task, TaskOutcome
from harness.engine.rank import START_TIMEOUT_S, calls_path, rank_main, timedelta
from harness.engine.reuse import reusable
from harness.engine.waiting import Look, Probe, Stop, WaitState
from harness.errors import HarnessError
from harness.judge.status import RankStatus, Status

log = logging.getLogger(__name__)

DUMP_WAIT_S = 2.0
STOP_WAIT_S = 5.0
LOG_TAIL = 6000


class PoolStartError(HarnessError):
    """No rank could start (exit 3)."""


class Pool:
    """``world_size`` rank processes started once; :meth:`run` sends them one task at a time."""

    def __init__(self, world_size: int, *, backend: str = "gloo", device: str = "cpu",
                 setup_impls: tuple[str, ...] = (), start_timeout: float = START_TIMEOUT_S,
                 start_method: Optional[str] = None, env: Optional[dict[str, str]] = None,
                 keep_failure_logs: bool = True):
        """``start_method``: forkserver or spawn (default: :func:`start_context`'s choice); ``env``: variables
        the ranks have from their first instruction on (set before they import torch: use spawn for that);
        ``keep_failure_logs``: a failed task's rank logs are kept in the cache (:mod:`harness.engine.logs`)."""
        self.world_size = world_size
        self.backend = backend
        self.device = device
        self.setup_impls = setup_impls
        self.start_timeout = start_timeout
        self.start_method = start_method
        self.env = dict(env or {})
        self.keep_failure_logs = keep_failure_logs
        self.reused_after_failure = 0  # failed tasks after which the ranks were kept (harness.engine.reuse)
        self.procs: list = []
        self.conns: list = []
        self.logdir: Optional[Path] = None
        self._store = None
        self._starting = False  # launched, not yet every rank in the process group

    @property
    def alive(self) -> bool:
        return bool(self.procs)

    @property
    def port(self) -> Optional[int]:
        """The rendezvous port the OS gave this pool (None when stopped)."""
        return self._store.port if self._store is not None else None

    def start(self) -> None:
        """Spawn the ranks and wait until every one has joined the process group."""
        self.launch()
        self.wait_started()

    def launch(self) -> None:
        """Spawn the ranks without waiting for them (:meth:`wait_started` waits; :meth:`run` does it first)."""
        import torch.distributed as dist

        self.close()
        logs.sweep_orphans()  # pools of a harness that was SIGKILLed (its ranks died with it) leave folders
        self.logdir = Path(tempfile.mkdtemp(prefix=f"{logs.POOL_PREFIX}{os.getpid()}-ws{self.world_size}-"))
        self._store = dist.TCPStore("127.0.0.1", 0, self.world_size + 1, True, wait_for_workers=False,
                                    timeout=timedelta(self.start_timeout))
        self._starting = True
        self._starting_step(self._spawn_quietly)  # (Ctrl-C reaches the harness alone; the ranks get the env)

    def wait_started(self) -> None:
        """Wait until every rank of a launched pool has joined the process group (at once if it has)."""
        if self._starting:
            self._starting_step(self._await_ready)
        self._starting = False

    def _starting_step(self, step) -> None:
        try:  # on failure the ranks go, their logs kept in the cache for a PoolStartError (which names them)
            step()
        except BaseException as exc:
            self.kill(keep_logs=isinstance(exc, PoolStartError))
            kept = self._keep_logs(f"ws{self.world_size}-start") if isinstance(exc, PoolStartError) else None
            if kept is not None:
                raise PoolStartError(f"{exc}\n(rank logs kept in {kept})") from None
            raise

    def _spawn_quietly(self) -> None:
        with _children_ignore_sigint(), _environment(self.env):
            self._spawn(start_context(self.start_method))

    def _spawn(self, ctx) -> None:
        for rank in range(self.world_size):
            parent_end, child_end = ctx.Pipe(duplex=True)
            proc = ctx.Process(
                target=rank_main,
                args=(rank, self.world_size, self._store.port, child_end, str(self.logdir / f"rank{rank}.log"),
                      os.getpid(), self.backend, self.device, self.setup_impls, dict(os.environ)),
                name=f"syncbn-rank{rank}", daemon=True)
            proc.start()
            child_end.close()
            self.procs.append(proc)
            self.conns.append(parent_end)

    def _await_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        pending = set(range(self.world_size))
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise PoolStartError(f"ranks {sorted(pending)} did not join the process group within "
                                     f"{self.start_timeout:.0f}s")
            for r in self._ready(pending, remaining):
                msg = self._recv(r)
                if msg is None:
                    raise PoolStartError(f"rank {r} died while starting ({describe_exit(self.procs[r].exitcode)}):"
                                         f"\n{self.log_tail(r)}")
                if msg.get("op") == "failed":
                    raise PoolStartError(f"rank {r} could not start: {msg.get('message')}\n{msg.get('traceback', '')}")
                pending.discard(r)

    def close(self) -> None:
        """Stop every rank: politely, then SIGKILL; reap them all."""
        for conn in self.conns:
            try:
                conn.send({"op": "stop"})
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + STOP_WAIT_S
        for proc in self.procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
        self.kill()

    def kill(self, *, keep_logs: bool = False) -> None:
        """Tear down at once (after a failure, or on Ctrl-C): SIGKILL every rank still alive, reap all.

        The rank logs' folder goes too: what a record needs of it (log tails, stack dumps, collectives) was
        read into the task's outcome before. ``keep_logs``: the folder stays (a start failure, whose error names
        it; a failed task, whose logs :mod:`harness.engine.logs` moves into the cache).
        """
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
        for proc in self.procs:
            proc.join(timeout=STOP_WAIT_S)
        for conn in self.conns:
            conn.close()
        self.procs, self.conns = [], []
        self._store = None
        self._starting = False
        if self.logdir is not None and not keep_logs:
            shutil.rmtree(self.logdir, ignore_errors=True)
            self.logdir = None

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    # ------------------------------------------------------------------ one task

    def run(self, task: Task, timeout: float) -> TaskOutcome:
        """Send ``task`` to every rank and attribute what each did (see the module docstring)."""
        if not self.alive:
            self.start()
        self.wait_started()
        for r in range(self.world_size):
            # Every rank is idle between tasks: emptied now, a rank's sink holds this task's collectives only, also
            # before the rank has begun it (read then, the last task's would pass for this one's).
            with contextlib.suppress(FileNotFoundError):
                os.truncate(calls_path(str(self.logdir / f"rank{r}.log")), 0)
        for conn in self.conns:
            try:
                conn.send({"op": "run", "task": task.to_dict()})
            except OSError:
                pass  # the rank is dead; its sentinel says so below
        n = self.world_size
        state = WaitState(world=n, started=time.monotonic(), timeout=timeout)
        while True:
            step = state.next_step(time.monotonic())
            if isinstance(step, Stop):
                break
            if isinstance(step, Probe):
                self._probe(state, step)
                continue
            for r in self._ready(state.pending, step.seconds):
                msg = self._recv(r)
                if msg is None:  # the process is gone
                    self.procs[r].join(timeout=STOP_WAIT_S)
                    state.died(r, time.monotonic(), exit_code=self.procs[r].exitcode, log=self.log_tail(r),
                               calls=self.calls_of(r))
                else:
                    state.answered(r, RankResult.from_dict(msg.get("result", {"rank": r})), time.monotonic())
            state.waited()
        observations = state.observations
        for r in sorted(state.pending):
            observations[r].stack_dump = state.evidence(r) or self.dump_stack(r)
            observations[r].collectives = self.calls_of(r)
        status, outcomes = attribute(list(observations.values()), failed_first=state.first_failure is not None,
                                     timeout=state.waited_s(step.reason, time.monotonic()),
                                     deadlocked=state.deadlocked)
        kept = None
        failed = status in (Status.ERROR, Status.CRASH, Status.HANG) or any(
            o.status in (RankStatus.ERROR, RankStatus.CRASH, RankStatus.PEER_FAILED) for o in outcomes)
        if failed and reusable(task.case, observations.values(), [o.status for o in outcomes]):
            self.reused_after_failure += 1  # every rank caught its own exception; nothing is left in flight
        elif failed:
            self.kill(keep_logs=True)  # a rank may be inside a collective: no task can follow on this group
            kept = self._keep_logs(f"ws{self.world_size}")
        return TaskOutcome(status=status, ranks=outcomes, results=[observations[r].result for r in range(n)],
                           logs=str(kept) if kept else None)

    def _probe(self, state: WaitState, probe: Probe) -> None:
        """Read what the waiting rule asked for (collectives from the sink files, stacks by faulthandler)."""
        if probe.look is Look.DEADLOCK:
            state.saw_deadlock(state.watch.check(self.calls_of, self.dump_stack), time.monotonic())
            return
        for r in probe.ranks:
            if probe.look is Look.CALLS:
                state.saw_calls(r, self.calls_of(r))
            else:
                state.saw_stack(r, self.dump_stack(r))

    def _keep_logs(self, label: str) -> Optional[Path]:
        """Move the rank logs of a failure into the cache (bounded, :mod:`harness.engine.logs`); where they went.

        None when this pool keeps none (``keep_failure_logs``) or they could not be moved: then they are removed.
        """
        folder, self.logdir = self.logdir, None
        if folder is None:
            return None
        kept = logs.keep(folder, label) if self.keep_failure_logs else None
        if kept is None:
            shutil.rmtree(folder, ignore_errors=True)
        return kept

    # ------------------------------------------------------------------ helpers

    def _ready(self, ranks: set[int], timeout: float) -> list[int]:
        """Ranks among ``ranks`` whose pipe has a message or whose process ended, within ``timeout``."""
        by_conn = {id(self.conns[r]): r for r in ranks}
        by_sentinel = {self.procs[r].sentinel: r for r in ranks}
        ready = wait([self.conns[r] for r in ranks] + list(by_sentinel), timeout=timeout)
        out = {by_sentinel[obj] if isinstance(obj, int) else by_conn[id(obj)] for obj in ready}
        return sorted(out)

    def _recv(self, r: int) -> Optional[dict]:
        conn = self.conns[r]
        try:
            if conn.poll(0):
                return conn.recv()
        except (EOFError, OSError):
            return None
        if self.procs[r].is_alive():  # the sentinel fired but the pipe is empty: the process is exiting
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
            time.sleep(0.01)
            now = read_from(path, before)
            if "most recent call first" in text and now == text:
                break  # faulthandler has written every thread: the dump stopped growing
            text = now
        return text[-LOG_TAIL:]

    def calls_of(self, r: int) -> Optional[list]:
        """The collectives rank ``r`` issued in the current task, from its sink file (None if unknown)."""
        return read_sink(calls_path(str(self.logdir / f"rank{r}.log"))) if self.logdir else None

    def log_tail(self, r: int, limit: int = LOG_TAIL) -> str:
        return read_from(self.logdir / f"rank{r}.log", 0)[-limit:] if self.logdir is not None else ""


@contextlib.contextmanager
def _environment(env: dict[str, str]):
    """``env`` set in this process while ranks are started (a spawned rank inherits it at exec), then undone."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.update({k: v for k, v in saved.items() if v is not None})
        for k in [k for k, v in saved.items() if v is None]:
            os.environ.pop(k, None)


@contextlib.contextmanager
def _children_ignore_sigint():
    """Ranks are born ignoring SIGINT (an ignored signal stays ignored across exec): a terminal's Ctrl-C goes to
    the whole process group, and the parent, not each rank, handles it, even while a rank is still starting."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def read_from(path: Path, offset: int) -> str:
    """The text of ``path`` from byte ``offset`` ('' if it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""
