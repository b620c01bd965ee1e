"""A case's tensors: regenerated from its seed, in every process that needs them.

:func:`materialize` makes a :class:`~harness.catalog.case.Case`'s inputs, upstream gradients and
parameters on CPU, identically in every process (the oracle's and every rank's), and rounds them to the
case's dtypes and layouts; nothing is sent between processes. The tables map a case's names (dtype, memory
format, the dtype its normals are drawn in) to torch's objects.

This is the catalog's only module that imports torch, so selecting cases (``catalog.select``, ``list cases``)
imports none (about 3 CPU-seconds on a small machine).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch

from harness.catalog.case import MEMORY_FORMAT_NAMES, NORMAL_DTYPE_NAMES, Case
from harness.catalog.dtypes import DTYPE_NAMES
from harness.slices import batch_slices

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}
NORMALS = {name: getattr(torch, name) for name in NORMAL_DTYPE_NAMES}
MEMORY_FORMATS = {name: getattr(torch, "contiguous_format" if name == "contiguous" else name)
                  for name in MEMORY_FORMAT_NAMES}


@dataclass
class CaseData:
    """The tensors of a case, on CPU, already in their dtypes and layouts."""

    inputs: list[list[Optional[torch.Tensor]]]  # [step][rank]; None for a rank not made (materialize's ranks)
    grad_outputs: list[list[Optional[torch.Tensor]]]
    weight: torch.Tensor
    bias: torch.Tensor
    running_mean: torch.Tensor
    running_var: torch.Tensor
    extra: dict = field(default_factory=dict)


def materialize(case: Case, ranks: Optional[Sequence[int]] = None) -> CaseData:
    """Regenerate the case's tensors from its seed, drawing its standard normals in its ``normals`` dtype (the
    same result in every process).

    ``ranks``: only these ranks' inputs and gradients (the others' entries are None), for a case drawn per rank
    (``draws="per-rank"``); a sequential case's ranks cannot be made alone, so it always makes every rank's.
    """
    gen = torch.Generator().manual_seed(case.seed)
    per_rank = case.draws == "per-rank"
    if ranks is not None and not per_rank:
        raise ValueError(f"case {case.id}: its samples are drawn in sequence, so no rank's can be made alone")
    wanted = set(range(case.world_size) if ranks is None else ranks)
    gens = [torch.Generator().manual_seed(s) for s in case.seeds_of_ranks()] if per_rank \
        else [gen] * case.world_size
    C = case.channels
    dtype = DTYPES[case.dtype]
    pdtype = DTYPES[case.param_dtype]
    fmt = MEMORY_FORMATS[case.memory_format]
    gfmt = MEMORY_FORMATS[case.grad_memory_format or case.memory_format]
    normals = NORMALS[case.normals]
    chan_off = torch.randn(C, generator=gen, dtype=torch.float64)
    chan_scale = torch.rand(C, generator=gen, dtype=torch.float64) * 1.5 + 0.5
    # Affine parameters of both signs and varied magnitude, never ones and zeros.
    sign = torch.where(torch.rand(C, generator=gen) < 0.3, -1.0, 1.0).double()
    weight = (sign * (torch.rand(C, generator=gen, dtype=torch.float64) * 1.5 + 0.25)).to(pdtype)
    bias = (torch.randn(C, generator=gen, dtype=torch.float64) * 0.5).to(pdtype)
    if not case.bias:  # drawn all the same, so that the draws after it are the same as with a bias
        bias = torch.zeros_like(bias)
    running_mean = (torch.randn(C, generator=gen, dtype=torch.float64) * 0.1).to(pdtype)
    running_var = (torch.rand(C, generator=gen, dtype=torch.float64) * 0.5 + 0.75).to(pdtype)
    if case.setup in ("as-built", "factory"):  # the constructor's values (drawn all the same, as the bias above)
        weight, bias = torch.ones_like(weight), torch.zeros_like(bias)
        running_mean, running_var = torch.zeros_like(running_mean), torch.ones_like(running_var)
    inputs, grads = [], []
    for s in range(len(case.steps)):
        xs, gs = [], []
        for r, (n, sp) in enumerate(zip(case.sizes_at(s), case.spatial)):
            if r not in wanted:
                xs.append(None)
                gs.append(None)
                continue
            shape = (n, C, *sp)
            bshape = (1, C) + (1,) * len(sp)
            # input_mean + input_scale * (chan_off + chan_scale * z), in float64, computed in place a batch slice
            # at a time and rounded to the case's dtype (the same operations on the same values: bitwise the
            # tensor the expression gives, without its temporaries, which stay in the cache).
            z = torch.randn(shape, generator=gens[r], dtype=normals)
            x = _empty_like(z, dtype, fmt)
            for a, e in batch_slices(z):
                v = z[a:e] if normals is torch.float64 else z[a:e].to(torch.float64)
                v.mul_(chan_scale.view(bshape)).add_(chan_off.view(bshape)).mul_(case.input_scale)
                v.add_(case.input_mean)
                for c in case.constant_channels:
                    v[:, c] = case.input_mean + case.input_scale * float(chan_off[c])
                x[a:e].copy_(v)
            g = torch.randn(shape, generator=gens[r], dtype=normals)
            if case.grad_mean != 0.0 or case.grad_scale != 1.0:  # plain normals stay bitwise as they were drawn
                g = (g.to(torch.float64) + case.grad_mean) * case.grad_scale
            xs.append(x)
            gs.append(_cast(g, dtype, gfmt))
        inputs.append(xs)
        grads.append(gs)
    return CaseData(inputs, grads, weight, bias, running_mean, running_var)


def _cast(t: torch.Tensor, dtype: torch.dtype, fmt: torch.memory_format) -> torch.Tensor:
    """``t`` rounded to ``dtype`` in layout ``fmt``, in one copy (``_layout(t.to(dtype), fmt)`` takes two)."""
    return _empty_like(t, dtype, fmt).copy_(t)


def _empty_like(t: torch.Tensor, dtype: torch.dtype, fmt: torch.memory_format) -> torch.Tensor:
    """An uninitialized tensor of ``t``'s shape in ``dtype`` and layout ``fmt`` (contiguous where ``fmt`` does not
    apply to ``t``'s number of dimensions)."""
    if fmt is torch.channels_last and t.dim() != 4 or fmt is torch.channels_last_3d and t.dim() != 5:
        fmt = torch.contiguous_format
    return torch.empty_like(t, dtype=dtype, memory_format=fmt)
