"""What torch's CUDA kernels of the five SyncBN ops compute, transliterated to CPU: the torch emulation's arithmetic.

Design note. ``torch.nn.SyncBatchNorm`` on CPU (:mod:`harness.impls.torch_emulation`) runs torch's own Python
over CPU kernels registered for ``batch_norm_stats``, ``batch_norm_gather_stats_with_counts``,
``batch_norm_elemt``, ``batch_norm_backward_reduce`` and ``batch_norm_backward_elemt``. Those kernels were the
reference's exact float64 ones, kinder than CUDA's: a defect that CUDA's arithmetic exposes (an undone fix
letting a zero-count row into the gather, a ``.contiguous()`` dropped before a kernel that reshapes) passed on
CPU. The functions here compute what the CUDA kernels compute, step for step where the steps decide the result:

- which code path runs: the layout predicates the CUDA host code uses (:mod:`harness.impls.cuda_contract`:
  ``channels_last_kernels``, ``elementwise_path``, 32-bit indexing); a contiguous-path kernel reads the input
  through ``reshape(N, C, -1)``, which raises for an empty input ("cannot reshape tensor of 0 elements ...",
  torch's own reshape raises it here, with CUDA's text); a channels-last elementwise kernel launched on an empty
  input has a grid of height 0 and CUDA refuses the launch (:data:`LAUNCH_ERROR`, seen on an H200); the channels-last
  backward_reduce on an empty input returns without writing, its outputs as allocated (NaN here); raw-pointer
  reads of 1-D parameters ignore their strides (``batch_norm_backward_elemt``'s channels-last kernel does not
  check them);
- the merge of gathered rows (``batch_norm_reduce_statistics_kernel``): one loop over every row, count 0
  included (a zero row's mean and invstd reach the sums: 0 * inf is NaN), the running count an int, ``n +
  count`` formed in the counts' dtype (half overflows past 65,504, bfloat16 rounds to 8 bits: pytorch#70901),
  the rest in acc (float for half, bfloat16 and float; double for double);
- the reductions (:mod:`harness.impls.cuda_reduce`): each thread's loop and the tree of merges, in acc; in the
  contiguous backward_reduce ``Float2`` rounds every per-element term and every shuffled partial to the input
  dtype where that is half or bfloat16 (pytorch#195701: a partial past 65,504 is inf under AMP), on releases
  before :data:`FLOAT2_WIDENED`;
- the elementwise kernels: each formula in the order its kernel writes it, in acc, rounded once to the output.

Outputs have CUDA's dtypes, shapes and memory formats. Dtype refusals are :mod:`~harness.impls.cuda_contract`'s,
checked before these run. Read from ``Normalization.cuh`` as shipped in the torch 2.13.0 (cf30153c4c13) and 2.14.1
(5c4886908584) wheels (identical), ``Normalization.cu`` at cyyever/pytorch@0d188885a9a2 (2026 main) and
pytorch/pytorch@181624244c76 (before 2.3); pytorch#196125 (Sept 2026) widens ``Float2`` after 2.14.1, so 2.15 is
taken as its first release (not read). Older releases' reduction trees were not read: they are emulated with
2.13's. Facts in our words; the code is a transliteration, not a copy. Checked against the real kernels of torch
2.11.0+cu130 on an H200 (tests/impls/test_cuda_arith.py, ``cuda`` marker): every op, every input there agrees.
"""

from __future__ import annotations

import re
from typing import Optional

import torch

from harness.impls import cuda_contract
from harness.impls.cuda_reduce import (flexible_launch, grad_sums_channels_last, grad_sums_contiguous,
                                       welford_channels_last, welford_contiguous)

REDUCED = (torch.float16, torch.bfloat16)
FLOAT2_WIDENED = (2, 15)  # first release assumed to hold pytorch#196125 (Float2 built from acc, no rounding)
LAUNCH_ERROR = "CUDA error: invalid argument"  # seen on an H200, torch 2.11.0+cu130 (a grid of height 0)
UNWRITTEN = float("nan")  # what an output the kernel never writes holds here (CUDA: whatever the allocator gave)


def release(version: Optional[str] = None) -> tuple:
    """(major, minor) of a torch version string (the installed one by default)."""
    m = re.match(r"(\d+)\.(\d+)", version or torch.__version__)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def float2_narrows(version: Optional[str] = None) -> bool:
    """Whether ``batch_norm_backward_reduce``'s contiguous kernel rounds its terms and partials to the input dtype."""
    return release(version) < FLOAT2_WIDENED


def launch_refused() -> BaseException:
    """The exception a CUDA launch with a zero grid dimension raises (``C10_CUDA_KERNEL_LAUNCH_CHECK``)."""
    return getattr(torch, "AcceleratorError", RuntimeError)(
        f"{LAUNCH_ERROR}\n(emulated: a channels-last kernel launched on an empty input has a grid of height 0)")


def _launch(reduction: int, stride: int, coop: bool) -> tuple:
    cfg = flexible_launch(reduction, stride, coop)
    if 0 in cfg:
        raise launch_refused()
    return cfg


def _rows(t: torch.Tensor) -> torch.Tensor:
    """A channels-last-contiguous tensor as its kernel's raw pointer reads it: [rows, C], row-major."""
    return t.movedim(1, -1).reshape(-1, t.shape[1])


def _by_channel(t: torch.Tensor, ndim: int) -> torch.Tensor:
    """A per-channel vector broadcast over an input of ``ndim`` dims."""
    return t.reshape((1, -1) + (1,) * (ndim - 2))


def _raw(t: Optional[torch.Tensor], n: int) -> Optional[torch.Tensor]:
    """A 1-D tensor as a raw pointer reads its first ``n`` values: consecutive from its data, strides ignored."""
    if t is None or t.is_contiguous():
        return t
    try:
        return t.as_strided((n,), (1,))
    except RuntimeError:  # past its storage: CUDA reads whatever lies there
        return torch.full((n,), UNWRITTEN, dtype=t.dtype)


def _nchw(x: torch.Tensor) -> torch.Tensor:
    """The contiguous templates' ``input.reshape({N, C, -1})``: raises for an empty input, as on CUDA."""
    return x.reshape(x.size(0), x.size(1), -1)


# ------------------------------------------------------------------ the five ops

def batch_norm_stats(x: torch.Tensor, eps: float) -> tuple:
    """(mean, invstd) in acc(input): Welford per thread, merged across the block (``batch_norm_stats_cuda``).

    An empty input: (0, NaN) where the channels-last kernel runs (2-D input, channels-last layouts); the contiguous
    kernel's reshape raises."""
    acc = cuda_contract.acc(x.dtype)
    if cuda_contract.fits_int32_indexing(x) and cuda_contract.channels_last_kernels(x):
        return welford_channels_last(_rows(x), acc, eps)
    return welford_contiguous(_nchw(x), acc, eps)


def _to_index(x: float, bits: int) -> int:
    """A float stored into the kernel's ``index_t`` as the GPU converts: truncated, saturated, NaN to 0."""
    if x != x:
        return 0
    top = 2.0 ** (bits - 1)
    return int(max(-top, min(top - 1, x)))


def batch_norm_gather_stats_with_counts(x: torch.Tensor, mean: torch.Tensor, invstd: torch.Tensor,
                                        running_mean: Optional[torch.Tensor], running_var: Optional[torch.Tensor],
                                        momentum: float, eps: float, counts: torch.Tensor) -> tuple:
    """The merged (mean, invstd) of every gathered row, as ``batch_norm_reduce_statistics_kernel`` loops over
    them (count-0 rows included); updates the running statistics in place."""
    sdt = running_mean.dtype if running_mean is not None else x.dtype  # scalar_t: what the kernel dispatches on
    acc = cuda_contract.acc(sdt)
    wide = torch.float64 if sdt == torch.float64 else torch.float32  # where an int meets a count: float, or double
    bits = 32 if cuda_contract.fits_int32_indexing(x) else 64
    counts = counts.to(sdt)
    vm, vi = mean.to(acc), invstd.to(acc)
    f_eps, f_mom = torch.tensor(eps, dtype=acc), torch.tensor(momentum, dtype=acc)
    avg = torch.zeros(vm.shape[1], dtype=acc)
    var_n = torch.zeros_like(avg)
    n = 0
    for j in range(vm.shape[0]):
        count = counts[j]
        c = count.to(acc)
        v = 1.0 / vi[j]
        v = (v * v - f_eps) * c
        n_s = torch.tensor(n, dtype=wide).to(sdt)  # n + count: the int as scalar_t, added in float, kept as scalar_t
        factor = (1.0 / (n_s.to(wide) + count.to(wide)).to(sdt).double()).to(acc)
        n_a = torch.tensor(n, dtype=acc)
        var_n = var_n + (v + (avg - vm[j]) * (avg - vm[j]) * n_a * c * factor)
        avg = n_a * factor * avg + c * factor * vm[j]
        n = _to_index(float(torch.tensor(n, dtype=wide) + count.to(wide)), bits)  # n += count, truncated
    n_a = torch.tensor(n, dtype=acc)
    out_invstd = 1.0 / torch.sqrt(var_n / n_a + f_eps)
    if running_mean is not None:
        running_mean.copy_(((1 - f_mom) * running_mean.to(acc) + f_mom * avg).to(sdt))
    if running_var is not None:
        unbiased = var_n / torch.tensor(n - 1, dtype=acc)
        running_var.copy_(((1 - f_mom) * running_var.to(acc) + f_mom * unbiased).to(sdt))
    out = torch.float32 if mean.dtype in REDUCED else mean.dtype
    return avg.to(out), out_invstd.to(out)


def elementwise_path(x: torch.Tensor, *params: Optional[torch.Tensor]) -> str:
    """``batch_norm_elementwise``'s path: ``contiguous``, ``channels_last`` (falling back to ``general`` where a
    parameter is not contiguous) or ``general``."""
    path = cuda_contract.elementwise_path(x)
    if path == "channels_last" and not all(p.is_contiguous() for p in params if p is not None):
        return "general"
    return path


def batch_norm_elemt(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                     mean: torch.Tensor, invstd: torch.Tensor) -> torch.Tensor:
    """The normalized input, in its dtype and strides: ``w * (x - mean) * invstd + b`` in acc (contiguous and
    channels-last kernels), ``(x - mean) * w * invstd + b`` (the TensorIterator path for other layouts)."""
    acc = cuda_contract.acc(x.dtype)
    path = elementwise_path(x, weight, bias, mean, invstd)
    c, nd = x.shape[1], x.dim()
    if path == "contiguous":
        _nchw(x)
    elif path == "channels_last":
        _launch(x.numel() // max(c, 1), c, False)
    one = torch.ones((), dtype=acc)
    w = _by_channel(weight.to(acc), nd) if weight is not None else one
    b = _by_channel(bias.to(acc), nd) if bias is not None else torch.zeros((), dtype=acc)
    m, inv = _by_channel(mean.to(acc), nd), _by_channel(invstd.to(acc), nd)
    xa = x.to(acc)
    y = (xa - m) * w * inv + b if path == "general" else w * (xa - m) * inv + b
    out = torch.empty_like(x)
    out.copy_(y.to(x.dtype))
    return out


def batch_norm_backward_reduce(g: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, invstd: torch.Tensor,
                               weight: Optional[torch.Tensor], input_g: bool, weight_g: bool, bias_g: bool) -> tuple:
    """(sum_dy, sum_dy_xmu, grad_weight, grad_bias) as ``batch_norm_backward_reduce_cuda`` returns them.

    The channels-last kernel computes all four whatever the flags (without a weight: empty weight gradients in
    the mean's dtype); the contiguous one only those asked for (None for the others)."""
    acc = cuda_contract.acc(x.dtype)
    c = x.shape[1]
    mixed = weight is not None and weight.dtype != x.dtype
    if (cuda_contract.fits_int32_indexing(g) and cuda_contract.channels_last_kernels(g)
            and cuda_contract.channels_last_kernels(x) and (weight is None or weight.is_contiguous())
            and mean.is_contiguous() and invstd.is_contiguous()):
        sums = grad_sums_channels_last(_rows(g), _rows(x), mean, acc)
        if sums is None:  # an empty input: nothing written
            sums = (torch.full((c,), UNWRITTEN, dtype=acc),) * 2
        sum_dy, sum_dy_xmu = sums
        if weight is None:
            gw = gb = mean.new_empty(0)
        else:
            layer = acc if mixed else x.dtype
            gw = (sum_dy_xmu * invstd.to(acc)).to(layer).to(weight.dtype)
            gb = sum_dy.to(layer).to(weight.dtype)
        return sum_dy.to(mean.dtype), sum_dy_xmu.to(mean.dtype), gw, gb
    x3 = _nchw(x)
    g3 = g.reshape(x3.shape)
    narrow = x.dtype if x.dtype in REDUCED and float2_narrows() else None
    sum_dy, sum_dy_xmu = grad_sums_contiguous(g3, x3, mean, acc, narrow)
    stat = acc if mixed else x.dtype  # stat_scalar_t: what the weight gradients are rounded to
    gw = (sum_dy_xmu * invstd.to(acc)).to(stat).to(weight.dtype) if weight_g and weight is not None else None
    gb = sum_dy.to(stat).to(weight.dtype) if bias_g and weight is not None else None
    if not input_g:
        return None, None, gw, gb
    return sum_dy.to(mean.dtype), sum_dy_xmu.to(mean.dtype), gw, gb


def batch_norm_backward_elemt(g: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, invstd: torch.Tensor,
                              weight: Optional[torch.Tensor], sum_dy: torch.Tensor, sum_dy_xmu: torch.Tensor,
                              count: torch.Tensor) -> torch.Tensor:
    """The input gradient: ``(g - sum_dy / n - (x - mean) * invstd^2 * sum_dy_xmu / n) * w * invstd`` in acc, n the
    sum of ``count`` (an int64 total); contiguous output, or the input's layout from the channels-last kernel."""
    acc = cuda_contract.acc(x.dtype)
    c, nd = x.shape[1], x.dim()
    cl = (cuda_contract.fits_int32_indexing(g) and cuda_contract.channels_last_kernels(g)
          and cuda_contract.channels_last_kernels(x))
    if cl:
        _launch(x.numel() // max(c, 1), c, False)
        mean, invstd, weight, sum_dy, sum_dy_xmu = (_raw(t, c) for t in (mean, invstd, weight, sum_dy, sum_dy_xmu))
        out = torch.empty_like(x)
    else:
        g = g.reshape(_nchw(x).shape).reshape(x.shape)
        out = torch.empty(x.shape, dtype=x.dtype)
    total = int(_raw(count.reshape(-1), count.numel()).to(torch.int64).sum())  # both kernels read it by pointer
    norm = 1.0 / torch.tensor(total, dtype=acc)
    inv = invstd.to(acc)
    m_dy = _by_channel(sum_dy.to(acc) * norm, nd)
    f1 = _by_channel(inv * inv * sum_dy_xmu.to(acc) * norm, nd)
    f2 = _by_channel((weight.to(acc) if weight is not None else torch.ones((), dtype=acc)) * inv, nd)
    out.copy_(((g.to(acc) - m_dy - (x.to(acc) - _by_channel(mean.to(acc), nd)) * f1) * f2).to(x.dtype))
    return out
