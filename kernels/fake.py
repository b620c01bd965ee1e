"""Fake (meta) implementations of the syncbn_ref ops: shapes, dtypes and layouts only.

They let ``torch.library.opcheck``, FakeTensor and torch.compile reason about
the ops without running them; each mirrors its kernel's output contract
(kernels/cpu/syncbn_cpu.cpp).
"""

from __future__ import annotations

import torch

_registered = False


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _vec(like: torch.Tensor, n: int, dtype: torch.dtype) -> torch.Tensor:
    return like.new_empty((n,), dtype=dtype)


def _register(name: str):
    register = getattr(torch.library, "register_fake", None) or torch.library.impl_abstract
    return register(f"syncbn_ref::{name}")


def register_fakes() -> None:
    """Register every fake once per process (after the extension is loaded)."""
    global _registered
    if _registered:
        return
    if not (hasattr(torch.library, "register_fake") or hasattr(torch.library, "impl_abstract")):
        return  # torch < 2.2: no Python fake registration; eager use needs none
    _registered = True

    @_register("batch_norm_stats")
    def _stats(input, eps):
        c = input.shape[1]
        return _vec(input, c, _acc(input.dtype)), _vec(input, c, _acc(input.dtype))

    @_register("batch_norm_gather_stats_with_counts")
    def _gather(input, mean, invstd, running_mean, running_var, momentum, eps, counts):
        c = mean.shape[1]
        return _vec(mean, c, _acc(mean.dtype)), _vec(mean, c, _acc(mean.dtype))

    @_register("batch_norm_elemt")
    def _elemt(input, weight, bias, mean, invstd, eps):
        return torch.empty_like(input)  # preserve_format: the input's (dense) layout

    @_register("batch_norm_backward_reduce")
    def _reduce(grad_out, input, mean, invstd, weight, input_g, weight_g, bias_g):
        c = input.shape[1]
        wdtype = weight.dtype if weight is not None else input.dtype
        # Like the ATen op, outputs whose flag is false are undefined (None in Python).
        return (_vec(mean, c, mean.dtype) if input_g else None, _vec(mean, c, mean.dtype) if input_g else None,
                _vec(mean, c, wdtype) if weight_g else None, _vec(mean, c, wdtype) if bias_g else None)

    @_register("batch_norm_backward_elemt")
    def _belemt(grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu, count):
        return torch.empty_like(input)

    @_register("welford_stats")
    def _welford(input):
        return _vec(input, 2 * input.shape[1] + 1, torch.float64)

    @_register("welford_merge")
    def _merge(gathered):
        return gathered.new_empty((gathered.shape[1],), dtype=torch.float64)

    @_register("welford_finish")
    def _finish(merged, running_mean, running_var, momentum, eps):
        c = (merged.shape[0] - 1) // 2
        return _vec(merged, c, torch.float64), _vec(merged, c, torch.float64)
