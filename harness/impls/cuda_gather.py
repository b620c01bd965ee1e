"""CUDA's merge of gathered statistics when the counts are half or bfloat16, step for step.

``torch.batch_norm_gather_stats_with_counts`` on CUDA merges the per-rank
(mean, invstd, count) rows in one loop per channel
(``batch_norm_reduce_statistics_kernel`` in ATen's ``native/cuda/Normalization.cuh``,
shipped in the wheel's include folder). The counts tensor has the running
statistics' dtype (torch's SyncBatchNorm casts them so), and the loop keeps its
running count ``n`` in a 32-bit integer but forms ``n + count`` in the counts'
dtype: for half counts that sum is rounded to half, and past 65,504 it is
infinite, so the weight ``1 / (n + count)`` is 0: the merged mean becomes 0
and the variance loses its between-rank part (pytorch#70901). bfloat16 counts
round it to 8 significant bits. Everything else runs in float (the accumulation type of
both dtypes); ``n += count`` adds in float and truncates.

The reference CPU kernel merges in float64 with exact counts, which is right
and is what the harness's oracle expects; the torch emulation uses
:func:`merge` instead wherever the counts are half or bfloat16, so that torch's
verdicts on CPU are CUDA's. For float and double counts CUDA's loop is exact
for any count a batch can have (below 2^24 per step), so the reference kernel
stands in. Float32 arithmetic here is elementwise like CUDA's, but nvcc may fuse
multiply-adds, so results agree to a few float32 roundings, not bit for bit.
"""

from __future__ import annotations

from typing import Optional

import torch

REDUCED = (torch.float16, torch.bfloat16)


def needed(counts: torch.Tensor) -> bool:
    """Whether CUDA's merge differs from an exact one for these counts (half or bfloat16)."""
    return counts.dtype in REDUCED


def _to_index(x: float) -> int:
    """A float stored into the kernel's 32-bit ``index_t`` as the GPU converts: truncated, saturated, NaN to 0."""
    if x != x:
        return 0
    return int(max(-2.0**31, min(2.0**31 - 1, x)))


def merge(mean: torch.Tensor, invstd: torch.Tensor, running_mean: Optional[torch.Tensor],
          running_var: Optional[torch.Tensor], momentum: float, eps: float,
          counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The merged (mean, invstd) as CUDA's kernel computes them; updates the running statistics in place."""
    acc = torch.float32
    vm, vi = mean.to(acc), invstd.to(acc)
    avg = torch.zeros(vm.shape[1], dtype=acc)
    var_n = torch.zeros_like(avg)
    f_eps = torch.tensor(eps, dtype=acc)
    n = 0  # index_t
    for j in range(vm.shape[0]):
        count = counts[j]
        c = float(count)  # exact: every half or bfloat16 is a float
        v = 1.0 / vi[j]
        v = (v * v - f_eps) * c
        # n + count: the int converted to the counts' dtype, added there (in float, rounded back).
        denom = float(torch.tensor(float(n), dtype=counts.dtype) + count)
        factor = torch.tensor(1.0 / denom if denom else float("inf"), dtype=torch.float64).to(acc)
        var_n = var_n + (v + (avg - vm[j]) * (avg - vm[j]) * n * c * factor)
        avg = n * factor * avg + c * factor * vm[j]
        n = _to_index(float(torch.tensor(float(n), dtype=acc) + torch.tensor(c, dtype=acc)))  # n += count
    out_mean = avg
    out_invstd = 1.0 / torch.sqrt(var_n / n + f_eps)
    m = torch.tensor(momentum, dtype=acc)
    if running_mean is not None:
        running_mean.copy_(((1 - m) * running_mean.to(acc) + m * avg).to(running_mean.dtype))
    if running_var is not None:
        unbiased = var_n / (n - 1)
        running_var.copy_(((1 - m) * running_var.to(acc) + m * unbiased).to(running_var.dtype))
    return out_mean.to(mean.dtype), out_invstd.to(invstd.dtype)
