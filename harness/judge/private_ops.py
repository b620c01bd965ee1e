"""torch's five private SyncBN ops as float64 formulas, and their outputs judged against them.

Design note. Code outside torch (horovod's SyncBN, apex, detectron2) calls ``torch.batch_norm_stats``,
``torch.batch_norm_gather_stats_with_counts``, ``torch.batch_norm_elemt``, ``torch.batch_norm_backward_reduce``
and ``torch.batch_norm_backward_elemt`` directly, so what each computes is a contract of its own. Each function
here is one op's contract, computed in float64 from the arguments exactly as they were passed (rounded inputs,
rounded statistics), and returns one :class:`Expected` per output: the value, the dtype the contract gives it
and a final tolerance. :func:`judge` compares what an op returned with them, output by output: a wrong dtype,
shape or memory format, or values out of tolerance, fail that output; so does a finite value where the formula
gives NaN (what an empty input's variance is), which :func:`~harness.judge.elementwise.compare_tensor` alone
would let pass.

The contract (torch/nn/modules/_functions.py is its caller; ``acc(T)`` is float64 for float64, else float32):

- ``batch_norm_stats(input, eps)``: per channel the mean and ``1 / sqrt(var + eps)``, var the biased variance,
  both in acc(input); an empty input gives mean 0 and invstd NaN (0 / 0), CUDA's channels-last kernel's answer;
- ``batch_norm_gather_stats_with_counts(input, mean, invstd, running_mean, running_var, momentum, eps, counts)``:
  the merge of the gathered rows, each weighted by its count, a row of count 0 adding nothing (torch's Function
  drops such rows before the call, except under CUDA graph capture; pytorch#78656 asks the kernels to give them no
  weight): mean, and invstd of the merged biased variance, each row's variance recovered as ``1 / invstd^2 -
  eps``; in acc(D), D the running statistics' dtype (else the input's); the running statistics updated in place,
  ``(1 - momentum) r + momentum s`` with the unbiased variance;
- ``batch_norm_elemt(input, weight, bias, mean, invstd, eps)``: ``(x - mean) invstd weight + bias``, in the
  input's dtype and layout;
- ``batch_norm_backward_reduce(grad_out, input, mean, invstd, weight, True, True, True)``: ``sum_dy`` and
  ``sum_dy_xmu = sum dy (x - mean)`` in the mean's dtype, ``grad_weight = sum_dy_xmu invstd`` and ``grad_bias =
  sum_dy`` in the weight's;
- ``batch_norm_backward_elemt(grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu, count)``: ``(dy - sum_dy
  / n - (x - mean) invstd^2 sum_dy_xmu / n) weight invstd``, n the sum of ``count``, in the input's dtype and layout.

Tolerances, in the units of :mod:`harness.judge.budget` (unit roundoffs ``u`` of a dtype, ``u_a`` of acc, the
growth ``gamma(n)`` of a reduction over n terms, the safety factor ``K``), per channel or element:

- stats: mean ``u_a gamma(n) (|mean| + std)``, invstd ``u_a gamma(n) (1 + invstd |mean|) invstd`` (a stable
  variance is exact up to the rounding of the mean, relative to |mean|); an empty input's mean exactly 0;
- gather over W rows: mean ``u_a gamma(W) (max |mean_j| + std)``, invstd ``u_a gamma(W) (1 + invstd max |mean_j|)
  invstd``; a running statistic ``u_D |new| + u_a ((1 - m) |old| + m |batch|)`` plus m times the batch
  statistic's tolerance (the variance's from invstd's, relative, doubled);
- elemt: ``u_in |y| + u_a ((|x| + |mean|) invstd |w| + |b|)``;
- backward_reduce: ``(u_in + u_a gamma(n)) sum |term|`` plus the output's rounding, as the layer's grad_bias
  budget (one rounding to the input dtype per term is allowed: CUDA's contiguous kernel stores every term and
  partial of half input in half, pytorch#195701; its overflow past 65,504 is not);
- backward_elemt: ``u_in |dx| + 4 u_a (|dy| + |sum_dy / n| + (|x| + |mean|) invstd^2 |sum_dy_xmu / n|) |w| invstd``.

Each is multiplied by K. Correct float64 and float32 arithmetic use a small part of it; a defect of the kind these
ops have shipped (a count-0 row's NaN, counts overflowing half, a variance returned for invstd, a partial sum past
half's range) is far outside it (``tests/judge/test_private_ops.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from harness.catalog.case import PRIVATE_OPS
from harness.judge.budget import K, UNIT_ROUNDOFF, gamma
from harness.judge.elementwise import compare_tensor
from harness.judge.metric import Metric, Problem

F64 = torch.float64
# Each op's outputs, in the order it returns them (the gather's running statistics are updated in place and judged
# beside them).
OUTPUTS = {
    "batch_norm_stats": ("mean", "invstd"),
    "batch_norm_gather_stats_with_counts": ("mean", "invstd"),
    "batch_norm_elemt": ("output",),
    "batch_norm_backward_reduce": ("sum_dy", "sum_dy_xmu", "grad_weight", "grad_bias"),
    "batch_norm_backward_elemt": ("grad_input",),
}
assert tuple(OUTPUTS) == PRIVATE_OPS


@dataclass
class Expected:
    """One output by the op's contract: its float64 value (NaN where the contract's answer is NaN), the dtype it
    comes in, its final tolerance (broadcastable to the value) and, for a tensor shaped like the input, the memory
    format it keeps."""

    value: torch.Tensor
    dtype: torch.dtype
    tol: torch.Tensor
    memory_format: Optional[torch.memory_format] = None


def acc(dtype: torch.dtype) -> torch.dtype:
    """The accumulation dtype of the ops' contract: float64 for float64, float32 for the rest."""
    return F64 if dtype == F64 else torch.float32


def _u(dtype: torch.dtype) -> float:
    return UNIT_ROUNDOFF[dtype]


def _dims(x: torch.Tensor) -> list[int]:
    return [0] + list(range(2, x.dim()))


def _by_channel(v: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return v.reshape((1, -1) + (1,) * (x.dim() - 2))


def _count(x: torch.Tensor) -> int:
    return x.numel() // x.shape[1] if x.shape[1] else 0


def _format(x: torch.Tensor) -> torch.memory_format:
    """The memory format an elementwise output keeps: the input's (channels-last where it is dense that way)."""
    if x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    if x.dim() == 5 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last_3d):
        return torch.channels_last_3d
    return torch.contiguous_format


def stats(x: torch.Tensor, eps: float) -> dict[str, Expected]:
    """``batch_norm_stats``: this input's mean and invstd per channel (an empty input: 0 and NaN)."""
    a, n, c = acc(x.dtype), _count(x), x.shape[1]
    if n == 0:
        return {"mean": Expected(torch.zeros(c, dtype=F64), a, torch.zeros(c, dtype=F64)),
                "invstd": Expected(torch.full((c,), math.nan, dtype=F64), a, torch.zeros(c, dtype=F64))}
    xd = x.detach().to(F64)
    mean = xd.mean(_dims(x))
    var = (xd - _by_channel(mean, x)).pow_(2).mean(_dims(x))
    invstd = 1.0 / torch.sqrt(var + eps)
    grow = K * _u(a) * gamma(n)
    return {"mean": Expected(mean, a, grow * (mean.abs() + var.sqrt())),
            "invstd": Expected(invstd, a, grow * (1.0 + invstd * mean.abs()) * invstd)}


def gather(input_dtype: torch.dtype, mean: torch.Tensor, invstd: torch.Tensor, counts: torch.Tensor,
           running_mean: Optional[torch.Tensor], running_var: Optional[torch.Tensor], momentum: float,
           eps: float) -> dict[str, Expected]:
    """``batch_norm_gather_stats_with_counts``: the merge of the rows of non-zero count, and the running statistics
    (as they were before the call) updated; ``mean`` and ``invstd`` are [W, C], ``counts`` [W]."""
    d = running_mean.dtype if running_mean is not None else input_dtype
    a = acc(d)
    c = counts.detach().to(F64).reshape(-1)
    keep = c > 0
    m, inv, c = mean.detach().to(F64)[keep], invstd.detach().to(F64)[keep], c[keep]
    n = float(c.sum())
    mu = (c[:, None] * m).sum(0) / n
    var = (c[:, None] * (1.0 / inv.pow(2) - eps + (m - mu).pow(2))).sum(0) / n
    out_invstd = 1.0 / torch.sqrt(var + eps)
    largest = m.abs().amax(0) if len(c) else torch.zeros_like(mu)
    grow = K * _u(a) * gamma(len(c))
    tol_mean = grow * (largest + var.sqrt())
    tol_invstd = grow * (1.0 + out_invstd * largest) * out_invstd
    out = {"mean": Expected(mu, a, tol_mean), "invstd": Expected(out_invstd, a, tol_invstd)}
    f = momentum
    if running_mean is not None:
        old = running_mean.detach().to(F64)
        new = (1 - f) * old + f * mu
        out["running_mean"] = Expected(new, running_mean.dtype, K * (_u(d) * new.abs() + _u(a) * (
            (1 - f) * old.abs() + f * mu.abs())) + f * tol_mean)
    if running_var is not None:
        old = running_var.detach().to(F64)
        unbiased = var * n / (n - 1) if n > 1 else torch.full_like(var, math.inf)
        new = (1 - f) * old + f * unbiased
        tol_var = 2.0 * tol_invstd / out_invstd * (var + eps) * (n / (n - 1) if n > 1 else math.inf)
        out["running_var"] = Expected(new, running_var.dtype, K * (_u(d) * new.abs() + _u(a) * (
            (1 - f) * old.abs() + f * unbiased.abs())) + f * tol_var)
    return out


def _vector(t: Optional[torch.Tensor], like: torch.Tensor, fill: float) -> torch.Tensor:
    """A per-channel parameter in float64 shaped for ``like`` (``fill`` where there is none)."""
    if t is None:
        return torch.full((1,) * like.dim(), fill, dtype=F64)
    return _by_channel(t.detach().to(F64), like)


def elemt(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], mean: torch.Tensor,
          invstd: torch.Tensor) -> dict[str, Expected]:
    """``batch_norm_elemt``: the normalized input."""
    xd = x.detach().to(F64)
    m, inv = _vector(mean, x, 0.0), _vector(invstd, x, 1.0)
    w, b = _vector(weight, x, 1.0), _vector(bias, x, 0.0)
    y = (xd - m) * inv * w + b
    tol = K * (_u(x.dtype) * y.abs() + _u(acc(x.dtype)) * ((xd.abs() + m.abs()) * inv * w.abs() + b.abs()))
    return {"output": Expected(y, x.dtype, tol, _format(x))}


def backward_reduce(grad_out: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, invstd: torch.Tensor,
                    weight: torch.Tensor) -> dict[str, Expected]:
    """``batch_norm_backward_reduce`` with every output asked for: the two sums and the weight's gradients."""
    dims = _dims(x)
    g, xmu = grad_out.detach().to(F64), x.detach().to(F64) - _vector(mean, x, 0.0)
    sum_dy, sum_dy_xmu = g.sum(dims), (g * xmu).sum(dims)
    per_term = _u(x.dtype) + _u(acc(x.dtype)) * gamma(_count(x))
    tol_dy = K * per_term * g.abs().sum(dims)
    tol_xmu = K * per_term * (g * xmu).abs().sum(dims)
    inv = invstd.detach().to(F64)
    grad_weight = sum_dy_xmu * inv
    sdt, wdt = mean.dtype, weight.dtype
    return {"sum_dy": Expected(sum_dy, sdt, tol_dy + K * _u(sdt) * sum_dy.abs()),
            "sum_dy_xmu": Expected(sum_dy_xmu, sdt, tol_xmu + K * _u(sdt) * sum_dy_xmu.abs()),
            "grad_weight": Expected(grad_weight, wdt, tol_xmu * inv + K * _u(wdt) * grad_weight.abs()),
            "grad_bias": Expected(sum_dy, wdt, tol_dy + K * _u(wdt) * sum_dy.abs())}


def backward_elemt(grad_out: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, invstd: torch.Tensor,
                   weight: Optional[torch.Tensor], sum_dy: torch.Tensor, sum_dy_xmu: torch.Tensor,
                   count: torch.Tensor) -> dict[str, Expected]:
    """``batch_norm_backward_elemt``: the input gradient from the group's sums, divided by the sum of ``count``."""
    n = float(count.detach().to(torch.int64).sum())
    g, xd = grad_out.detach().to(F64), x.detach().to(F64)
    m, inv, w = _vector(mean, x, 0.0), _vector(invstd, x, 1.0), _vector(weight, x, 1.0)
    mean_dy = _vector(sum_dy, x, 0.0) / n
    proj = inv * inv * _vector(sum_dy_xmu, x, 0.0) / n
    dx = (g - mean_dy - (xd - m) * proj) * w * inv
    terms = g.abs() + mean_dy.abs() + (xd.abs() + m.abs()) * proj.abs()
    tol = K * (_u(x.dtype) * dx.abs() + 4 * _u(acc(x.dtype)) * terms * w.abs() * inv)
    return {"grad_input": Expected(dx, x.dtype, tol, _format(x))}


def judge(op: str, expected: dict[str, Expected], observed: dict[str, Optional[torch.Tensor]]
          ) -> list[tuple[str, Metric]]:
    """Every expected output of ``op`` against what it returned (CPU tensors by name), as ``(<op>.<name>, Metric)``."""
    out = []
    for name, want in expected.items():
        got = observed.get(name)
        key = f"{op}.{name}"
        if got is None:
            out.append((key, Metric.failure(f"the op returned no {name}", Problem.SHAPE)))
            continue
        metric = compare_tensor(got, want.value, want.tol, dtype=want.dtype, memory_format=want.memory_format)
        nan = torch.isnan(want.value)
        if metric.ok and bool(nan.any()) and not bool(torch.isnan(got.detach().to(F64))[nan].all()):
            finite = int((~torch.isnan(got.detach().to(F64))[nan]).sum())
            metric = Metric.failure(f"{finite} values where the op's contract gives NaN are not NaN "
                                    f"({got.detach().to(F64)[nan][:4].tolist()})", Problem.NON_FINITE)
        out.append((key, metric))
    return out
