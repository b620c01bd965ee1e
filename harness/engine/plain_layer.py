"""What ``nn.BatchNorm`` itself refuses: a SyncBN error that the layer it replaces raises too is no defect.

A SyncBN is a drop-in for ``nn.BatchNorm``. Where the plain layer of this torch
refuses the case's dtypes (float32 input with float64 parameters on CPU:
"mixed dtype (CPU): expect parameter to have scalar type of Float"), a SyncBN
that raises the very same error is behaving as documented, and its record is
``unsupported`` with that reason, not an ``error`` to report.

Protocol: :func:`refusal` probes ``nn.BatchNorm{1,2,3}d`` on the CPU, on a
tiny input of the case's dtype with parameters of its parameter dtype, in the
modes the case's steps use (training, evaluation), and returns what it raises
as ``"Type: message"`` (None: it accepts). :func:`refused_like_the_layer` is
true when at least one rank raised and every rank that raised gave exactly
that. Only layer cases are probed (a model's other layers refuse for their own
reasons). On CUDA nothing is probed here (it would start a CUDA context in the
parent): :mod:`harness.impls.cuda_contract` marks torch's CUDA refusals that
``nn.BatchNorm`` shares ``unsupported`` before the case runs.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Optional

from harness.catalog.case import STEP_KINDS
from harness.results.records import RankStatus


@lru_cache(maxsize=64)
def _probe(dtype: str, param_dtype: str, affine: bool, track_running_stats: bool, ndim: int,
           mode: str) -> Optional[str]:
    import torch

    layer = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d, 5: torch.nn.BatchNorm3d}[ndim]
    bn = layer(2, affine=affine, track_running_stats=track_running_stats).to(getattr(torch, param_dtype))
    bn.train(mode == "train")
    x = torch.arange(4 * 2 * 2 ** (ndim - 2), dtype=torch.float64).reshape(4, 2, *[2] * (ndim - 2))
    try:
        with torch.no_grad():
            bn(x.to(getattr(torch, dtype)))
    except Exception as exc:  # noqa: BLE001 - whatever the layer raises is what is compared
        return f"{type(exc).__name__}: {exc}"
    return None


def refusal(case, device: str) -> Optional[str]:
    """What ``nn.BatchNorm`` raises on ``case``'s dtypes in one of its steps' modes, on CPU (None: it accepts)."""
    if device != "cpu" or case.scenario != "layer":
        return None
    for mode in dict.fromkeys(STEP_KINDS[s] for s in case.steps):
        said = _probe(case.dtype, case.param_dtype, case.affine, case.track_running_stats, case.ndim, mode)
        if said:
            return said
    return None


def refused_like_the_layer(case, device: str, ranks: list) -> Optional[str]:
    """The layer's refusal when every rank that raised (at least one) raised exactly it; else None."""
    said = refusal(case, device)
    raised = [o for o in ranks if o.status is RankStatus.ERROR]
    if said is None or not raised:
        return None
    if all(f"{o.exception_type}: {o.message}".strip() == said.strip() for o in raised):
        return said
    return None
