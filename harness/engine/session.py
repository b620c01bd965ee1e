"""Run a selection: (case x implementation) through warm pools, one record each.

:func:`run_selection` is how the local launcher
(:class:`harness.engine.launcher.LocalPools`, which starts the forkserver
first) runs every command's plan (``run``, ``check``, ``gate``, ``repro``);
:class:`Session` is what it, ``search`` (given by the same launcher) and the
pytest plugin of ``cases/`` use to run one (case, impl) at a time. Records are yielded as
cases finish, so callers can store and print them one by one. Cases are
grouped by world size and backend (a case may name its own, see
``Case.backend``); the pool of each starts when first needed and is closed
when its cases are done, or killed on any exception (Ctrl-C and
SIGTERM included), so no rank outlives the run.

On CUDA, ranks share the GPUs round-robin (rank r uses GPU r mod count, see
:mod:`harness.engine.rank`). gloo carries CUDA tensors, so any number of ranks
may share one GPU; nccl needs a GPU per rank, so with fewer GPUs than a case
has ranks, that case's records are ``skipped`` (:mod:`harness.engine.admission`) instead
of failing inside nccl.
"""

from __future__ import annotations

import time
from typing import Iterator, Optional

from harness.buildinfo import BuildInfo, build_info
from harness.engine import admission, assemble
from harness.engine.admission import gpu_shortage  # noqa: F401 - re-exported for callers of this module
from harness.engine.diagnosis import diagnose
from harness.engine.pool import Pool
from harness.judge.status import Status
from harness.results.records import Record
from harness.impls import resolve_impls  # noqa: F401 - re-exported for callers of this module
from harness.selection import RunOptions


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
        self.unavailable = admission.unavailable(impls, opts.device, self.info.cuda_available)
        self._setup = tuple(i.key for i in impls if i.name not in self.unavailable)
        self.gpus = visible_gpus(opts.device)
        self.pools: dict[tuple[int, str], Pool] = {}

    def _record(self, case, impl, status: Status, reason: str) -> Record:
        return assemble.not_run(case, impl, self.info, self.opts.device, self.opts.resolved_backend, status, reason)

    def run_one(self, case, impl) -> Record:
        """The record of one (case, impl): skipped, unsupported, or run in the warm pool of its world size."""
        opts = self.opts
        refused = admission.refusal(case, impl, opts, self.unavailable, gpus=self.gpus)
        if refused is not None:
            return self._record(case, impl, refused.status, refused.reason)
        key = pool_key(case, opts.resolved_backend)
        pool = self.pools.get(key)
        if pool is None:
            pool = self.pools[key] = Pool(case.world_size, backend=key[1], device=opts.device,
                                          setup_impls=self._setup)
        started, t0 = assemble.now(), time.perf_counter()
        task = admission.task_for(case, impl, opts)
        outcome = pool.run(task, timeout=case.timeout(opts.timeout))
        # The record is the run's (its build key names the run's backend); a case that names its own backend
        # says so in its parameters.
        record = assemble.from_outcome(case, impl, self.info, opts.device, opts.resolved_backend, outcome, started,
                                       time.perf_counter() - t0)
        if opts.diagnose and record.status in (Status.CRASH, Status.HANG) and not record.known:
            record.diagnosis = diagnose(task, case.world_size, key[1], opts.device, opts.timeout)
        return record

    def prestart(self, keys) -> None:
        """Launch the pools of ``keys`` ((world size, backend) pairs) now, without waiting for them: their ranks
        join while this process goes on, and the first task of each pool waits for what is left."""
        for key in keys:
            if key not in self.pools:
                pool = self.pools[key] = Pool(key[0], backend=key[1], device=self.opts.device,
                                              setup_impls=self._setup)
                pool.launch()

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
