"""Run a selection: (case x implementation) through warm pools, one record each.

:func:`run_selection` is the plain function behind ``run``, ``check``,
``gate`` and ``repro``; :class:`Session` is what it and the pytest plugin of
``cases/`` use to run one (case, impl) at a time. Records are yielded as
cases finish, so callers can store and print them one by one. Cases are
grouped by world size and backend (a case may name its own, see
``Case.backend``); the pool of each starts when first needed and is closed
when its cases are done, or killed on any exception (Ctrl-C and
SIGTERM included), so no rank outlives the run.

On CUDA, ranks share the GPUs round-robin (rank r uses GPU r mod count, see
:mod:`harness.engine.rank`). gloo carries CUDA tensors, so any number of ranks
may share one GPU; nccl needs a GPU per rank, so with fewer GPUs than a case
has ranks, that case's records are ``skipped`` (:func:`gpu_shortage`) instead
of failing inside nccl.
"""

from __future__ import annotations

import time
from typing import Callable, Iterator, Optional

from harness.buildinfo import BuildInfo, build_info
from harness.engine import assemble
from harness.engine.diagnosis import diagnose
from harness.engine.messages import Task
from harness.engine.pool import Pool
from harness.errors import ImplUnavailable
from harness.results.records import Record, Status
from harness.scenarios import unsupported_reason as scenario_unsupported
from harness.impls import resolve_impls  # noqa: F401 - re-exported for callers of this module
from harness.selection import RunOptions


def gpu_shortage(device: str, backend: str, world_size: int, gpus: int) -> Optional[str]:
    """Why a case of ``world_size`` ranks cannot run here over ``backend`` (None: it can).

    Pure: nccl needs one GPU per rank, gloo lets ranks share one GPU, CPU runs need none.
    """
    if device == "cuda" and backend == "nccl" and gpus < world_size:
        return (f"nccl needs one GPU per rank: {gpus} visible, the case has {world_size} ranks "
                "(--backend gloo lets ranks share a GPU)")
    return None


def visible_gpus(device: str) -> int:
    """How many GPUs the ranks of a ``device`` run can use (0 for CPU runs; torch honours CUDA_VISIBLE_DEVICES)."""
    if device != "cuda":
        return 0
    import torch

    return torch.cuda.device_count()


class Session:
    """Warm pools kept across calls (one per world size and backend), for running (case, impl) one at a time.

    Implementations that cannot run here are found once, at the start: their
    records are ``skipped`` with the reason (:attr:`unavailable`).
    """

    def __init__(self, impls: list, opts: RunOptions, info: Optional[BuildInfo] = None):
        self.opts = opts
        self.info = info or build_info()
        self.impls = impls
        self.unavailable: dict[str, str] = {}
        for impl in impls:
            try:
                impl.check_available_on(opts.device)
            except ImplUnavailable as exc:
                self.unavailable[impl.name] = str(exc)
        if opts.device == "cuda" and not self.info.cuda_available:
            for impl in impls:
                self.unavailable.setdefault(impl.name, "no CUDA device on this machine")
        self._setup = tuple(i.key for i in impls if i.name not in self.unavailable)
        self.gpus = visible_gpus(opts.device)
        self.pools: dict[tuple[int, str], Pool] = {}

    def _record(self, case, impl, status: Status, reason: str) -> Record:
        return assemble.not_run(case, impl, self.info, self.opts.device, self.opts.resolved_backend, status, reason)

    def run_one(self, case, impl) -> Record:
        """The record of one (case, impl): skipped, unsupported, or run in the warm pool of its world size."""
        opts = self.opts
        backend = case.backend_for(opts.resolved_backend)
        if impl.name in self.unavailable:
            return self._record(case, impl, Status.SKIPPED, self.unavailable[impl.name])
        reason = impl.unsupported_reason(case, opts.device) or scenario_unsupported(case, impl, opts.device, backend)
        if reason:
            return self._record(case, impl, Status.UNSUPPORTED, reason)
        reason = gpu_shortage(opts.device, backend, case.world_size, self.gpus)
        if reason:
            return self._record(case, impl, Status.SKIPPED, reason)
        key = pool_key(case, opts.resolved_backend)
        pool = self.pools.get(key)
        if pool is None:
            pool = self.pools[key] = Pool(case.world_size, backend=backend, device=opts.device,
                                          setup_impls=self._setup)
        started, t0 = assemble.now(), time.perf_counter()
        compare = opts.compare[1] if opts.compare and impl.name == opts.compare[0] else None
        task = Task(case=case.to_dict(), impl=impl.key, device=opts.device, compare=compare)
        outcome = pool.run(task, timeout=opts.timeout)
        # The record is the run's (its build key names the run's backend); a case that names its own backend
        # says so in its parameters.
        record = assemble.from_outcome(case, impl, self.info, opts.device, opts.resolved_backend, outcome, started,
                                       time.perf_counter() - t0)
        if opts.diagnose and record.status in (Status.CRASH, Status.HANG) and not record.known:
            record.diagnosis = diagnose(task, case.world_size, backend, opts.device, opts.timeout)
        return record

    def close(self, key: Optional[tuple[int, str]] = None, *, kill: bool = False) -> None:
        """Stop one pool (``key``: world size and backend) or all: politely, or at once with ``kill``."""
        for k in [key] if key is not None else list(self.pools):
            pool = self.pools.pop(k, None)
            if pool is None:
                continue
            if kill:
                pool.kill()
            else:
                pool.close()


def pool_key(case, run_backend: str) -> tuple[int, str]:
    """The pool a case runs in: its world size and its backend."""
    return case.world_size, case.backend_for(run_backend)


def run_selection(cases: list, impls: list, opts: RunOptions, info: Optional[BuildInfo] = None,
                  pairs: Optional[set[tuple[str, str]]] = None) -> Iterator[Record]:
    """Yield one record per (case, impl), running what can run in warm pools (one pool at a time).

    ``pairs``: only these (case id, impl name) pairs (``--resume`` runs what the store lacks).
    """
    session = Session(impls, opts, info)
    by_pool: dict[tuple[int, str], list] = {}
    for case in cases:
        by_pool.setdefault(pool_key(case, opts.resolved_backend), []).append(case)
    try:
        for key in sorted(by_pool):
            for case in by_pool[key]:
                for impl in impls:
                    if pairs is None or (case.id, impl.name) in pairs:
                        yield session.run_one(case, impl)
            session.close(key)
    except BaseException:
        # Ctrl-C, SIGTERM, a closed generator or a bug: ranks may be busy or stuck, do not wait for them.
        session.close(kill=True)
        raise


def execute_run(cases: list, impls: list, opts: RunOptions, *, store_dir, resume: bool = False,
                on_record: Optional[Callable[[Record], None]] = None,
                on_abort: Optional[Callable[[list[Record]], None]] = None) -> tuple[list[Record], bool]:
    """``run``: records of the selection, each appended to the store as it finishes.

    Locally, this process drives warm pools. Under torchrun it is one rank;
    only the writing rank gets records and stores them (the second value says
    whether this process is the writer). ``on_abort`` is called with every
    record so far when a torchrun job must end early (a rank stuck in a
    collective); the process then exits 1.
    """
    from harness.engine import torchrun
    from harness.results.store import Store, build_key, completed

    store = Store(store_dir) if store_dir else None
    info = build_info()

    def emit(rec: Record) -> None:
        if store is not None:
            store.append(rec)
        if on_record:
            on_record(rec)

    if torchrun.under_torchrun():
        job = torchrun.Job(cases, impls, opts, info)
        return job.run(emit, on_abort or (lambda records: None)), job.is_writer
    pairs = None
    if resume and store is not None:
        key = build_key(info.torch_version, info.torch_git_version, opts.device, opts.resolved_backend)
        done = completed(store.read(key) if key in store.builds() else [])
        pairs = {(c.id, i.name) for c in cases for i in impls if (c.id, i.name) not in done}
    out = []
    for rec in run_selection(cases, impls, opts, info, pairs=pairs):
        emit(rec)
        out.append(rec)
    return out, True
