"""The calls torch's SyncBatchNorm makes for a case, planned and checked against CUDA's kernels before it runs.

Design note. :mod:`harness.impls.cuda_contract` models each of the five ATen
ops CUDA runs; this module plans the calls the installed
``torch.nn.modules._functions.SyncBatchNorm`` makes for one case, on meta
tensors, rank by rank: ``batch_norm_stats``, the gather of every rank's rows
and counts, ``batch_norm_elemt``, then (with a backward) the two backward
ops, each given the dtypes the previous op returns. It reads from the
function's source whether it casts counts and weight (pytorch#98332, torch >=
2.1). :func:`syncbn_refusal` is the first call CUDA refuses;
:func:`syncbn_unsupported_reason` makes a case ``unsupported`` before it runs
where ``nn.BatchNorm`` on CUDA refuses its dtypes too
(:func:`harness.judge.plain_layer.refusal_on_cuda`): a documented limitation,
not a finding. The table: docs/catalog-and-judgement.md, "torch on CPU".
"""

from __future__ import annotations

import functools
import inspect
from typing import Optional

import torch

from harness.catalog.case import TRAINING_KINDS
from harness.catalog.data import DTYPES
from harness.impls.cuda_contract import Refusal, verdict
from harness.judge import plain_layer

BACKWARD_KINDS = ("train", "fwd")  # step kinds whose forward gets a backward (TRAINING_KINDS: every one that trains)
_FORMATS = {"channels_last": (4, torch.channels_last), "channels_last_3d": (5, torch.channels_last_3d)}


@functools.lru_cache(maxsize=1)
def function_casts() -> tuple:
    """Whether the installed torch's SyncBN Function casts (counts to the running statistics' dtype, the weight
    to the mean's dtype before backward_elemt): pytorch#98332, torch >= 2.1. Read from its source; (True, True)
    if the source cannot be read."""
    try:
        from torch.nn.modules._functions import SyncBatchNorm as Function

        forward, backward = inspect.getsource(Function.forward), inspect.getsource(Function.backward)
    except (ImportError, OSError, TypeError):
        return True, True
    return ".to(running_mean.dtype)" in forward, ".to(mean.dtype)" in backward


def _laid_out(shape: tuple, dtype: torch.dtype, fmt: str) -> torch.Tensor:
    """A meta tensor laid out as torch's Function passes it on: channels-last dense stays, the rest contiguous."""
    t = torch.empty(shape, dtype=dtype, device="meta")
    ndim, memory_format = _FORMATS.get(fmt, (None, None))
    return t.contiguous(memory_format=memory_format) if ndim == len(shape) else t


def _group_size(case, rank: int) -> int:
    return next((len(g) for g in case.groups if rank in g), 1) if case.groups else case.world_size


def _rank_inputs(case):
    """(shape, group size, with backward) of every non-empty rank input of a synchronized training step."""
    seen = set()
    for s, kind in enumerate(case.steps):
        if kind not in TRAINING_KINDS:
            continue
        sizes = case.step_batch_sizes[s] if case.step_batch_sizes else case.batch_sizes
        for rank, batch in enumerate(sizes):
            shape = (batch, case.channels, *case.spatial[rank])
            key = (shape, _group_size(case, rank), kind in BACKWARD_KINDS)
            if batch and all(shape) and key[1] > 1 and key not in seen:
                seen.add(key)
                yield key


def _meta(shape: tuple, dtype: torch.dtype, present: bool = True) -> Optional[torch.Tensor]:
    return torch.empty(shape, dtype=dtype, device="meta") if present else None


def _rank_refusal(case, shape: tuple, world: int, backward: bool) -> Optional[Refusal]:
    """Torch's Function's calls on one rank, planned with the dtypes each op returns; the first refusal."""
    x_dt, p_dt, c = DTYPES[case.dtype], DTYPES[case.param_dtype], case.channels
    casts_counts, casts_weight = function_casts()
    fmt = case.memory_format if case.input_layout == "dense" else "contiguous"
    x = _laid_out(shape, x_dt, fmt)
    w = _meta((c,), p_dt, case.affine)
    b = _meta((c,), p_dt, case.affine and case.bias)
    rm = rv = _meta((c,), p_dt, case.track_running_stats)
    v = verdict("batch_norm_stats", {"input": x, "eps": case.eps})
    if v.refusal:
        return v.refusal
    rows = _meta((world, c), v.outputs[0])
    counts = _meta((world,), rm.dtype if rm is not None and casts_counts else v.outputs[0])
    v = verdict("batch_norm_gather_stats_with_counts", {"input": x, "mean": rows, "invstd": rows, "running_mean": rm,
                                                         "running_var": rv, "counts": counts})
    if v.refusal:
        return v.refusal
    mean = _meta((c,), v.outputs[0])
    v = verdict("batch_norm_elemt", {"input": x, "weight": w, "bias": b, "mean": mean, "invstd": mean})
    if v.refusal or not backward:
        return v.refusal
    g = _laid_out(shape, x_dt, case.grad_memory_format or case.memory_format)
    v = verdict("batch_norm_backward_reduce", {"grad_out": g, "input": x, "mean": mean, "invstd": mean, "weight": w,
                                                "input_g": True, "weight_g": case.affine, "bias_g": b is not None})
    if v.refusal:
        return v.refusal
    if w is not None and casts_weight and w.dtype != mean.dtype:
        w = _meta((c,), mean.dtype)
    sums = _meta((c,), v.outputs[0])
    return verdict("batch_norm_backward_elemt", {"grad_out": g, "input": x, "mean": mean, "invstd": mean, "weight": w,
                                                 "sum_dy": sums, "sum_dy_xmu": sums,
                                                 "count": _meta((world,), torch.int32)}).refusal


def syncbn_refusal(case) -> Optional[Refusal]:
    """The first refusal CUDA's kernels give ``torch.nn.SyncBatchNorm`` on ``case`` (None: every call accepted).

    Only synchronized training forwards (and their backwards) call the five ops; empty ranks call fewer of them
    and are judged by the non-empty ones (their own dtype defect is a known issue, not a refusal).
    """
    for shape, world, backward in _rank_inputs(case):
        refusal = _rank_refusal(case, shape, world, backward)
        if refusal is not None:
            return refusal
    return None


def syncbn_unsupported_reason(case, device: str = "cuda") -> Optional[str]:
    """The ``unsupported`` reason for ``case`` where ``nn.BatchNorm`` on CUDA refuses its dtypes and torch's SyncBN
    reaches a refusal too: in a synchronized step's ops, or on CUDA where it calls the plain batch norm (eval, a
    group of one rank; on CPU that is CPU's own layer, :mod:`harness.judge.plain_layer`); None otherwise. A refusal
    ``nn.BatchNorm`` does not make is SyncBN being stricter than the layer it replaces: the case runs, the emulated
    kernel raises CUDA's error, and the record is an ``error`` (a finding)."""
    bn = plain_layer.refusal_on_cuda(case.dtype, case.param_dtype, case.affine, case.ndim)
    refusal = None if bn is None else syncbn_refusal(case)
    plain = device == "cuda" and bn is not None and refusal is None and any(
        batch and (kind not in TRAINING_KINDS or _group_size(case, rank) == 1) for s, kind in enumerate(case.steps)
        for rank, batch in enumerate(case.step_batch_sizes[s] if case.step_batch_sizes else case.batch_sizes))
    if refusal is None and not plain:
        return None
    where = f"a synchronized training step ({refusal})" if refusal else "the steps that call the plain batch norm"
    return (f"torch's CUDA kernels refuse {case.dtype} input with {case.param_dtype} parameters in {where}; "
            f"nn.BatchNorm on CUDA refuses it too ({bn}): a documented limitation "
            "(docs/catalog-and-judgement.md, torch on CPU)")
