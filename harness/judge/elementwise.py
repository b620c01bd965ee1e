"""One observed tensor against its float64 truth, elementwise, under a final tolerance: a :class:`Metric`.

The tolerance comes final from :mod:`harness.judge.budget` (the policy lives
there); this module only applies it. A large tensor is compared a batch slice
at a time (:mod:`harness.slices`), its tolerance given whole (sliced
alongside when it has the batch dimension) or built slice by slice by a
function ``tol(a, b)``, and the slices' findings merged: the largest errors,
the worst err/tol ratio with the tolerance there, the count of non-finite
values. The result is the whole tensor's comparison whatever the slicing.

Structural checks come first, on the whole tensor: dtype, shape, memory format.
NaN or Inf where the truth is finite is a mismatch; where the truth lies beyond
the expected dtype's range, infinity (or the largest finite value) of its sign
is the right answer.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple, Optional, Union

import torch

from harness.judge.metric import Metric, Problem
from harness.slices import CHUNK, batch_slices

TINY = 1e-300
Tolerance = Union[torch.Tensor, Callable[[int, int], torch.Tensor]]


class _Part(NamedTuple):
    """What one slice found."""

    err_max: float
    rel_max: float
    ratio: float
    tol_at: float
    nonfinite: int  # non-finite observed values where the truth is finite


def compare_tensor(got: Optional[torch.Tensor], true: torch.Tensor, tol: Tolerance, *,
                   dtype: Optional[torch.dtype] = None,
                   memory_format: Optional[torch.memory_format] = None) -> Metric:
    """Compare ``got`` with the float64 ``true`` elementwise against the final tolerance ``tol``: a tensor
    broadcastable to ``true``, or a function of batch bounds ``(a, b)`` giving the tolerance of ``true[a:b]``."""
    if got is None:
        got = torch.zeros_like(true)  # a missing gradient is a gradient of zeros
    elif dtype is not None and got.dtype != dtype:
        return Metric.failure(f"dtype {got.dtype}, expected {dtype}", Problem.DTYPE)
    if tuple(got.shape) != tuple(true.shape):
        return Metric.failure(f"shape {tuple(got.shape)}, expected {tuple(true.shape)}", Problem.SHAPE)
    if memory_format is not None and got.dim() in (4, 5) and got.numel() > 0 \
            and not got.is_contiguous(memory_format=memory_format):
        return Metric.failure(f"output not in {memory_format}", Problem.LAYOUT)
    if true.numel() == 0:
        return Metric(0.0, 0.0, 0.0, 0.0)
    got = got.detach()
    if true.dim() == 0 or true.numel() <= CHUNK:
        parts = [_compare(got, true, tol(0, true.shape[0] if true.dim() else 1) if callable(tol) else tol, dtype)]
    else:
        parts = [_compare(got[a:b], true[a:b], tol(a, b) if callable(tol) else _rows(tol, true, a, b), dtype)
                 for a, b in batch_slices(true)]
    nonfinite = sum(p.nonfinite for p in parts)
    if nonfinite:
        return Metric(math.inf, math.inf, 0.0, math.inf, f"{nonfinite} non-finite values where the oracle is finite",
                      Problem.NON_FINITE)
    worst = max(parts, key=lambda p: (math.isnan(p.ratio), p.ratio))  # NaN first, as torch's argmax
    return Metric(max(p.err_max for p in parts), max(p.rel_max for p in parts), worst.tol_at, worst.ratio)


def _rows(tol: torch.Tensor, true: torch.Tensor, a: int, b: int) -> torch.Tensor:
    """The tolerance of ``true[a:b]``: ``tol``'s rows a:b when it has the batch dimension, else all of it."""
    if tol.dim() == true.dim() and tol.shape[0] == true.shape[0] and tol.shape[0] != 1:
        return tol[a:b]
    return tol


def _compare(got: torch.Tensor, true: torch.Tensor, tol: torch.Tensor, dtype: Optional[torch.dtype]) -> _Part:
    """One slice. The common case (a finite truth inside the dtype's range, finite results, positive
    tolerances) takes as few passes as it can: finiteness is read off the maxima the metric needs anyway, and
    masks are built only where a maximum says some element needs one."""
    # Work on the dimensions in memory order: the same elements, every tensor contiguous (a whole-tensor max
    # over a channels_last tensor reads it with strides, 10-20x slower than over the same memory in order).
    order = memory_order(true)
    t = true.to(torch.float64).permute(order)
    g = got.to(torch.float64).cpu().permute(order)
    tol = tol.to(torch.float64)
    if tol.dim() == t.dim():
        tol = tol.permute(order)
    t_abs = t.abs()
    t_max = float(t_abs.max())  # NaN when any true value is NaN
    finite: Optional[torch.Tensor] = None  # None: every true value counts (all finite, none beyond range)
    if not math.isfinite(t_max):
        finite = torch.isfinite(t)
    if dtype is not None and dtype.is_floating_point and dtype != torch.float64 \
            and not t_max <= torch.finfo(dtype).max:
        # A true value beyond the dtype's range rounds to infinity: +-inf (or +-max) of its sign is exact there.
        big = torch.finfo(dtype).max
        finite = torch.isfinite(t) if finite is None else finite
        beyond = finite & (t_abs > big)
        if bool(beyond.any()):
            overflow = beyond & ((g.abs() == math.inf) | (g.abs() == big)) & (g.sign() == t.sign())
            finite = finite & ~overflow
    err = torch.sub(g, t).abs_()
    if not err.is_contiguous():  # ``got`` laid out otherwise than the truth
        err = err.contiguous()
    if finite is not None:
        err.masked_fill_(~finite, 0.0)
    err_max = float(err.max())
    if not math.isfinite(err_max):  # a non-finite result where the truth is finite (or an overflowing g - t)
        bad = ~torch.isfinite(g) if finite is None else finite & ~torch.isfinite(g)
        count = int(bad.sum())
        if count:
            return _Part(math.inf, math.inf, math.inf, 0.0, count)
    rel = torch.div(err, t_abs.clamp_min_(TINY), out=t_abs)
    rel_max = float(rel.max())
    if float(tol.min()) >= TINY:  # NaN fails this too
        ratio = torch.div(err, tol, out=rel)  # err 0 gives 0 with a positive finite or infinite tolerance
    else:
        ratio = torch.div(err, tol.clamp_min(TINY), out=rel)
        ratio.masked_fill_(err == 0, 0.0)
    where = _unravel(int(ratio.reshape(-1).argmax()), ratio.shape)  # the first worst element in memory order
    return _Part(err_max, rel_max, float(ratio[where]), float(torch.broadcast_to(tol, t.shape)[where]), 0)


def memory_order(t: torch.Tensor) -> tuple[int, ...]:
    """The permutation of ``t``'s dimensions that makes it contiguous (outermost in memory first), or the identity
    when ``t`` is contiguous or no permutation makes it so (a strided view)."""
    identity = tuple(range(t.dim()))
    if t.is_contiguous():
        return identity
    order = tuple(sorted(identity, key=lambda d: (-t.stride(d), d)))
    return order if t.permute(order).is_contiguous() else identity


def _unravel(flat: int, shape: torch.Size) -> tuple[int, ...]:
    """The index of element ``flat`` of a contiguous tensor of ``shape``."""
    where = []
    for size in reversed(shape):
        flat, i = divmod(flat, size)
        where.append(i)
    return tuple(reversed(where))
