"""Whether a (case, impl) runs here, and the task it runs as: one rule for the local pool and torchrun.

Protocol: a launcher calls :func:`unavailable` once per run (implementations
that cannot run on this device: their records are ``skipped`` with the
reason), then, per (case, impl), :func:`refusal` (None: run it) and
:func:`task_for` (the :class:`~harness.engine.messages.Task` every rank gets,
``--compare``'s second implementation included). The checks, in order:

1. the implementation is unavailable here (not installed, no CUDA device):
   ``skipped``;
2. the implementation or the case's scenario cannot run the case on this
   device and backend: ``unsupported``;
3. a torchrun job has one backend, so a case that names its own cannot run
   in it: ``unsupported``;
4. nccl needs a GPU per rank, and this machine has fewer than the case has
   ranks: ``skipped`` (the local pool only; torchrun's agents place ranks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from harness.catalog.case import NO_GROUP
from harness.engine.messages import Task
from harness.errors import ImplUnavailable
from harness.judge.status import Status
from harness.scenarios import unsupported_reason as scenario_unsupported


@dataclass(frozen=True)
class Refusal:
    """Why a (case, impl) does not run: its record's status (skipped or unsupported) and the reason."""

    status: Status
    reason: str


def unavailable(impls: list, device: str, cuda_available: bool) -> dict[str, str]:
    """Implementation name -> why it cannot run on ``device`` here (absent: it can)."""
    out: dict[str, str] = {}
    for impl in impls:
        try:
            impl.check_available_on(device)
        except ImplUnavailable as exc:
            out[impl.name] = str(exc)
    if device == "cuda" and not cuda_available:
        for impl in impls:
            out.setdefault(impl.name, "no CUDA device on this machine")
    return out


def gpu_shortage(device: str, backend: str, world_size: int, gpus: int) -> Optional[str]:
    """Why a case of ``world_size`` ranks cannot run here over ``backend`` (None: it can).

    Pure: nccl needs one GPU per rank, gloo lets ranks share one GPU, CPU runs need none.
    """
    if device == "cuda" and backend == "nccl" and gpus < world_size:
        return (f"nccl needs one GPU per rank: {gpus} visible, the case has {world_size} ranks "
                "(--backend gloo lets ranks share a GPU)")
    return None


def fixed_backend(case, run_backend: str) -> Optional[str]:
    """Why a case that names its own backend cannot run in a torchrun job (None: it can)."""
    if case.backend == NO_GROUP:
        return "the case runs in one process without a process group, and a torchrun job's ranks have one: run it " \
               "without torchrun"
    if case.backend_for(run_backend) != run_backend:
        return (f"the case runs over {case.backend}, and a torchrun job has one backend ({run_backend}): run it "
                f"with --backend {case.backend}, or without torchrun")
    return None


def refusal(case, impl, opts, unavailable_impls: dict[str, str], *, gpus: Optional[int],
            one_backend: bool = False) -> Optional[Refusal]:
    """Why ``impl`` does not run ``case`` here (None: it runs).

    ``gpus``: GPUs the ranks can use (None: not this launcher's concern); ``one_backend``: the launcher runs
    every case over the run's backend (torchrun).
    """
    if impl.name in unavailable_impls:
        return Refusal(Status.SKIPPED, unavailable_impls[impl.name])
    backend = case.backend_for(opts.resolved_backend)
    reason = (impl.unsupported_reason(case, opts.device) or scenario_unsupported(case, impl, opts.device, backend)
              or (fixed_backend(case, opts.resolved_backend) if one_backend else None))
    if reason:
        return Refusal(Status.UNSUPPORTED, reason)
    if gpus is not None:
        reason = gpu_shortage(opts.device, backend, case.world_size, gpus)
        if reason:
            return Refusal(Status.SKIPPED, reason)
    return None


def task_for(case, impl, opts) -> Task:
    """The task every rank runs for (case, impl); with ``--compare A,B``, A's task also runs B."""
    compare = opts.compare[1] if opts.compare and impl.name == opts.compare[0] else None
    return Task(case=case.to_dict(), impl=impl.key, device=opts.device, compare=compare)
