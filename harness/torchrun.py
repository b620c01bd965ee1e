"""Running under ``torchrun``: this process is one rank of a (possibly multi-node) job.

Protocol:
- Detected from torchrun's environment (``TORCHELASTIC_RUN_ID`` with ``RANK``
  and ``WORLD_SIZE``); the process group is initialized from it (``env://``),
  whatever rendezvous torchrun used.
- Every rank computes the same selection, keeps the cases whose world size
  equals the job's, and runs them in the same order with the same worker code
  as the local pool (:func:`harness.worker.run_task`).
- After each case the ranks' plain-dict results go to rank 0 over a separate
  gloo group (so the implementation's collectives and the harness's never
  interleave); rank 0 builds the record and writes it (store, table, JSON).
- There is no pool to restart here: a rank that crashes ends the job, as
  torchrun decides. A rank that stays silent past ``--timeout`` dumps its
  Python stacks (faulthandler) and exits non-zero, so torchrun reports it
  instead of waiting forever.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import time
from typing import Iterator, Optional

from harness.buildinfo import build_info
from harness.case import Case
from harness.impls import Impl
from harness.records import RankOutcome, Record, Status

def under_torchrun() -> bool:
    """Whether this process was started by torchrun (torch.distributed.run)."""
    env = os.environ
    return "TORCHELASTIC_RUN_ID" in env and "RANK" in env and "WORLD_SIZE" in env


def run_as_rank(cases: list[Case], impls: list[Impl], opts) -> Iterator[Record]:
    """Run the selected cases as one torchrun rank; yields records on rank 0 only."""
    import datetime

    import torch.distributed as dist

    from harness.runner import _from_outcome, _now, _record
    from harness.pool import TaskOutcome
    from harness.worker import RankContext, run_task

    backend = opts.resolved_backend
    timeout = datetime.timedelta(seconds=max(opts.timeout, 60))
    dist.init_process_group(backend, init_method="env://", timeout=timeout)
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        control = dist.new_group(backend="gloo", timeout=timeout)
        info = build_info()
        ctx = RankContext(rank, world)
        mine = [c for c in cases if c.world_size == world]
        for impl in impls:
            if _available(impl):
                impl.setup_rank(opts.device)
        for case in mine:
            for impl in impls:
                reason = None if _available(impl) else _unavailable_reason(impl)
                if reason:
                    if rank == 0:
                        yield _record(case, impl, info, opts, Status.SKIPPED, reason)
                    continue
                reason = impl.unsupported_reason(case, opts.device)
                if reason:
                    if rank == 0:
                        yield _record(case, impl, info, opts, Status.UNSUPPORTED, reason)
                    continue
                started, t0 = _now(), time.perf_counter()
                faulthandler.dump_traceback_later(opts.timeout, exit=True, file=sys.stderr)
                result = run_task(ctx, {"case": case.to_dict(), "impl": impl.key, "device": opts.device})
                gathered: list = [None] * world if rank == 0 else []
                dist.gather_object(result, gathered if rank == 0 else None, dst=0, group=control)
                faulthandler.cancel_dump_traceback_later()
                if rank == 0:
                    outcomes = [RankOutcome(rank=r["rank"], status=r["status"], exception_type=r.get("exception_type"),
                                            message=r.get("message", ""), traceback=r.get("traceback"))
                                for r in gathered]
                    statuses = {o.status for o in outcomes}
                    status = Status.ERROR if "error" in statuses else (
                        Status.MISMATCH if "mismatch" in statuses else Status.PASS)
                    outcome = TaskOutcome(status=status, ranks=outcomes, results=gathered, pool_broken=False)
                    yield _from_outcome(case, impl, info, opts, outcome, started, time.perf_counter() - t0)
        dist.barrier(group=control)
    finally:
        dist.destroy_process_group()


def _available(impl: Impl) -> bool:
    return _unavailable_reason(impl) is None


_reasons: dict[str, Optional[str]] = {}


def _unavailable_reason(impl: Impl) -> Optional[str]:
    from harness.errors import ImplUnavailable

    if impl.name not in _reasons:
        try:
            impl.check_available()
            _reasons[impl.name] = None
        except ImplUnavailable as exc:
            _reasons[impl.name] = str(exc)
    return _reasons[impl.name]
