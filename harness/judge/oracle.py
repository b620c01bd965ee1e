"""The float64 ground truth of synchronized batch normalization.

Everything is computed on CPU in float64 from the inputs exactly as an
implementation sees them (already rounded to the input dtype), with the
closed-form batch-norm formulas over the *global* batch: each process group's
ranks' inputs taken together, per channel, over every rank's (N, spatial)
elements. Ranks may differ in batch size (including 0) and in spatial size.

Per step of a case (``fwd`` and ``nograd`` steps normalize as ``train`` does,
``eval-rank0`` as ``eval``):
- ``train``: batch statistics of the group; running_mean/running_var updated
  with ``momentum`` (or the cumulative average when ``momentum`` is None) and
  the *unbiased* variance of the global count; num_batches_tracked += 1.
- ``eval``: running statistics, no synchronization. When the module tracks no
  running statistics, eval normalizes with each rank's own batch statistics,
  as ``torch.nn.SyncBatchNorm`` (and plain BatchNorm in each process) does.

Degenerate global batches follow ``nn.BatchNorm`` over the same global
batch, not any SyncBN: a training step whose group holds no value at all
(every rank empty) outputs nothing, gives zero gradients, counts the step in
num_batches_tracked and leaves the running statistics as they were; a
training step whose group holds one value per channel is refused, as
``nn.BatchNorm`` raises "Expected more than 1 value per channel when
training" (``StepTruth.raises``; the oracle stops there, and the buffers are
the previous step's). One rank with a single value in a larger group is an
ordinary step.

Buffers and parameters live in the parameter dtype: after every update the
running statistics are rounded to it, because every implementation has to
store them there. Nothing else is rounded.

Memory stays bounded at real network sizes (hundreds of thousands of values
per channel per rank): per-channel reductions (count, mean, the sum of
squared deviations from the group's mean, sum(dy), sum(dy * (x - mean)), the
affine gradients) run over each rank's tensor in slices of at most
:data:`harness.slices.CHUNK` elements converted to float64 one at a time, in two passes (the
mean first, then deviations from it), so no rank's data is ever concatenated
with another's or widened whole. The per-element results (output and
grad_input) are produced only for the ranks asked for (``ranks``): a rank
process asks for its own.

A rank process that holds only its own tensors (a case drawn per rank) passes
an ``exchange``: its per-channel sums are summed over its group by the other
ranks' (:mod:`harness.engine.exchange`), all training steps' at once, two
exchanges per case; the sums, and so every truth, are those of a process
holding every rank's tensors, bit for bit (they are added in the same order).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch

from harness.catalog.case import STEP_KINDS
from harness.slices import batch_slices

Tensor = torch.Tensor
# exchange(t, unit): ``t`` (this rank's part) summed over the ranks of ``unit`` (see run_oracle)
SumOver = Callable[[Tensor, Sequence[int]], Tensor]
# What nn.BatchNorm raises in training when a channel has one value in the whole (global) batch.
ONE_VALUE = "Expected more than 1 value per channel when training"


@dataclass
class StepTruth:
    """Exact results of one step, one entry per rank where the quantity is per rank."""

    kind: str
    output: list[Tensor]
    grad_input: list[Tensor]
    grad_weight: list[Optional[Tensor]]  # each rank's local share (None when affine is off)
    grad_bias: list[Optional[Tensor]]
    grad_weight_sum: Optional[Tensor]  # the sum of the shares over all ranks
    grad_bias_sum: Optional[Tensor]
    running_mean: list[Optional[Tensor]]  # after the step (None when not tracked)
    running_var: list[Optional[Tensor]]
    num_batches_tracked: list[Optional[int]]
    # Per rank: the mean and 1/std used to normalize (for tolerances).
    mean: list[Tensor] = field(default_factory=list)
    invstd: list[Tensor] = field(default_factory=list)
    count: list[int] = field(default_factory=list)
    # Per rank: mean |dy| and mean |dy * xhat| over the values normalized together (for tolerances: the
    # input gradient's error scales with these means over the whole group, not one rank's share).
    mean_abs_dy: list[Tensor] = field(default_factory=list)
    mean_abs_dy_xhat: list[Tensor] = field(default_factory=list)
    # Per rank: its own sums of |dy| and |dy * xhat| (for the budgets of its gradient shares).
    rank_abs_dy: list[Optional[Tensor]] = field(default_factory=list)
    rank_abs_dy_xhat: list[Optional[Tensor]] = field(default_factory=list)
    # Set when ``nn.BatchNorm`` over this step's global batch raises (the message): the step is refused, the
    # buffers stay as they were, and the oracle has no later steps.
    raises: Optional[str] = None


def _bcast(v: Tensor, like: Tensor) -> Tensor:
    return v.view(1, -1, *([1] * (like.dim() - 2)))


def channel_sum(x: Tensor, fn=None, y: Optional[Tensor] = None) -> Tensor:
    """Per-channel float64 sum over (N, *spatial) of ``fn(x)`` (or ``fn(x, y)``), a slice at a time."""
    dims = [0] + list(range(2, x.dim()))
    total = torch.zeros(x.shape[1], dtype=torch.float64)
    for a, b in batch_slices(x):
        xs = x[a:b].detach().to(torch.float64)
        if y is not None:
            v = fn(xs, y[a:b].detach().to(torch.float64))
        else:
            v = fn(xs) if fn is not None else xs
        total += v.sum(dim=dims)
    return total


@dataclass
class DeviationSums:
    """Per-channel float64 sums over one rank's (N, *spatial) elements, with ``xmu = x - mean``."""

    squares: Optional[Tensor]  # sum(xmu ** 2), when asked for
    dy: Tensor  # sum(dy)
    dy_xmu: Tensor  # sum(dy * xmu)
    abs_dy: Tensor  # sum(|dy|)
    abs_dy_xmu: Tensor  # sum(|dy * xmu|)


def deviation_sums(x: Tensor, dy: Tensor, mean: Tensor, *, squares: bool) -> DeviationSums:
    """The sums of :class:`DeviationSums` in one pass, a batch slice (:mod:`harness.slices`) at a time.

    Each slice is widened to float64 once (five separate passes widened x four times and dy four times);
    the values summed are the same elementwise products as in separate passes, slice by slice.
    """
    dims = [0] + list(range(2, x.dim()))
    C = x.shape[1]
    acc = [torch.zeros(C, dtype=torch.float64) for _ in range(5)]
    for a, b in batch_slices(x):
        xmu = x[a:b].detach().to(torch.float64, copy=True)
        xmu -= _bcast(mean, xmu)
        d = dy[a:b].detach().to(torch.float64, copy=True)
        prod = d * xmu
        acc[1] += d.sum(dim=dims)
        acc[2] += prod.sum(dim=dims)
        acc[3] += d.abs_().sum(dim=dims)
        acc[4] += prod.abs_().sum(dim=dims)
        if squares:
            acc[0] += xmu.mul_(xmu).sum(dim=dims)
    return DeviationSums(acc[0] if squares else None, *acc[1:])


def _normalize(x: Tensor, dy: Tensor, mean: Tensor, invstd: Tensor, w: Tensor, b: Tensor,
               count: int, sum_dy: Tensor, sum_dy_xmu: Tensor, training: bool):
    """Forward output and input gradient of one rank (all float64)."""
    # A batch slice at a time, in place: the same operations on the same values as the textbook expressions
    # xmu invstd w + b and (dy - mean(dy) - xmu proj) invstd w, without whole-size temporaries.
    out = torch.empty_like(x, dtype=torch.float64)
    gin = torch.empty_like(dy, dtype=torch.float64)
    scale = _bcast(invstd * w, x)
    if training:
        grad_mean = _bcast(sum_dy / count, x)
        minus_proj = _bcast(-(sum_dy_xmu / count * invstd * invstd), x)
    for a, e in batch_slices(x):
        xmu = x[a:e].detach().to(torch.float64, copy=True).sub_(_bcast(mean, x))
        torch.addcmul(_bcast(b, x), xmu, scale, out=out[a:e])
        g = gin[a:e].copy_(dy[a:e].detach())
        if training:
            g.sub_(grad_mean).addcmul_(xmu, minus_proj)
        g.mul_(scale)
    return out, gin


@dataclass(frozen=True)
class _Layer:
    """The layer's settings the oracle needs at every step, in float64 where they are numbers."""

    channels: int
    eps: float
    momentum: Optional[float]
    affine: bool
    track_running_stats: bool
    weight: Tensor
    bias: Tensor
    param_dtype: torch.dtype
    ranks: Optional[Sequence[int]]  # whose output and grad_input are wanted (None: every rank's)
    frozen_buffers: bool = False  # buffers there, never updated nor counted (track_running_stats off after)


@dataclass
class _Buffers:
    """Each rank's running statistics between steps (ranks of different groups track different ones)."""

    mean: list
    var: list
    tracked: list


def run_oracle(
    inputs: Sequence[Sequence[Tensor]],
    grad_outputs: Sequence[Sequence[Tensor]],
    steps: Sequence[str],
    *,
    num_features: int,
    eps: float = 1e-5,
    momentum: Optional[float] = 0.1,
    affine: bool = True,
    track_running_stats: bool = True,
    weight: Optional[Tensor] = None,
    bias: Optional[Tensor] = None,
    param_dtype: torch.dtype = torch.float32,
    running_mean: Optional[Tensor] = None,
    running_var: Optional[Tensor] = None,
    groups: Optional[Sequence[Sequence[int]]] = None,
    ranks: Optional[Sequence[int]] = None,
    exchange: Optional[SumOver] = None,
    frozen_buffers: bool = False,
    batches_tracked: int = 0,
) -> list[StepTruth]:
    """Exact results of every step of a case.

    ``inputs[s][r]`` and ``grad_outputs[s][r]`` are rank ``r``'s tensors at step
    ``s``; ``groups`` partitions the ranks into process groups (default: one
    group of all ranks). ``weight``/``bias`` are the initial affine parameters
    (default ones/zeros), ``running_mean``/``running_var`` the initial buffers
    (default zeros/ones). ``ranks``: the ranks whose output and grad_input are
    wanted (default: every rank); the others' are None.

    ``exchange``: for a rank process that holds only its own tensors (the others' entries in ``inputs`` and
    ``grad_outputs`` are None; ``ranks`` is that one rank): ``exchange(t, unit)`` returns ``t`` summed over
    the ranks of ``unit``, each rank adding its own; it is called twice per case (when it has a training
    step), the same on every rank. Only this rank's entries are filled then, and the sums over all ranks of
    the gradient shares are left to the caller (``grad_weight_sum`` is None).

    ``frozen_buffers``: the module has running statistics but ``track_running_stats`` was switched off after
    construction: nn.BatchNorm then normalizes training steps with batch statistics and leaves the buffers (and
    their count) alone, and normalizes eval steps with the buffers. ``batches_tracked``: the count of
    training steps before the first (a layer trained before, or loaded): momentum=None's average goes on from it.
    """
    if exchange is not None and (ranks is None or len(ranks) != 1):
        raise ValueError("an exchanged oracle computes one rank's truth: give ranks=[that rank]")
    if len(inputs) != len(steps) or len(grad_outputs) != len(steps):
        raise ValueError(f"need one input list and one grad list per step: {len(steps)} steps, "
                         f"{len(inputs)} inputs, {len(grad_outputs)} grads")
    world = len(inputs[0])
    groups = [list(g) for g in (groups or [list(range(world))])]
    if sorted(r for g in groups for r in g) != list(range(world)):
        raise ValueError(f"groups {groups} must partition ranks 0..{world - 1}")
    C = num_features
    f64 = torch.float64
    layer = _Layer(C, eps, momentum, affine, track_running_stats,
                   weight.detach().to(f64) if affine and weight is not None else torch.ones(C, dtype=f64),
                   bias.detach().to(f64) if affine and bias is not None else torch.zeros(C, dtype=f64),
                   param_dtype, ranks, frozen_buffers)
    buffers = _initial_buffers(layer, world, running_mean, running_var, batches_tracked)
    bad = [step for step in steps if step not in STEP_KINDS]
    if bad:
        raise ValueError(f"unknown step {bad[0]!r}: steps are {', '.join(STEP_KINDS)}")
    known = {} if exchange is None else _exchanged_sums(inputs, grad_outputs, steps, groups, ranks[0], C, exchange)
    truths = []
    for s, step in enumerate(steps):
        kind = STEP_KINDS[step]  # what the normalization does: batch statistics ("train") or running ones
        truth = _blank(kind, world)
        for group in groups:
            # Statistics: over the whole group in training, per rank when eval lacks buffers.
            for unit in [group] if kind == "train" else [[r] for r in group]:
                if exchange is None or ranks[0] in unit:
                    _normalize_unit(truth, unit, inputs[s], grad_outputs[s], layer, buffers, known.get(s))
        if affine and exchange is None:
            truth.grad_weight_sum = torch.stack(truth.grad_weight).sum(0)
            truth.grad_bias_sum = torch.stack(truth.grad_bias).sum(0)
        truth.running_mean = [t.clone() if t is not None else None for t in buffers.mean]
        truth.running_var = [t.clone() if t is not None else None for t in buffers.var]
        truth.num_batches_tracked = list(buffers.tracked)
        truths.append(truth)
        if truth.raises:
            break
    return truths


def _initial_buffers(layer: _Layer, world: int, running_mean: Optional[Tensor],
                     running_var: Optional[Tensor], tracked: int = 0) -> _Buffers:
    """Every rank's buffers before the first step, rounded to the parameter dtype (None when not tracked)."""
    if not layer.track_running_stats:
        return _Buffers([None] * world, [None] * world, [None] * world)

    def buffer(v: Optional[Tensor], default: float) -> Tensor:
        t = v.detach().to(torch.float64) if v is not None else torch.full((layer.channels,), default,
                                                                            dtype=torch.float64)
        return t.to(layer.param_dtype).to(torch.float64)

    return _Buffers([buffer(running_mean, 0.0) for _ in range(world)],
                    [buffer(running_var, 1.0) for _ in range(world)], [tracked] * world)


def _blank(kind: str, world: int) -> StepTruth:
    """A step's truth before any unit of ranks is normalized: every per-rank entry None (counts 0)."""
    def nones() -> list:
        return [None] * world

    return StepTruth(kind=kind, output=nones(), grad_input=nones(), grad_weight=nones(), grad_bias=nones(),
                     grad_weight_sum=None, grad_bias_sum=None, running_mean=nones(), running_var=nones(),
                     num_batches_tracked=nones(), mean=nones(), invstd=nones(), count=[0] * world,
                     mean_abs_dy=nones(), mean_abs_dy_xhat=nones(), rank_abs_dy=nones(), rank_abs_dy_xhat=nones())


def _first(x: Tensor) -> Tensor:
    """One rank's per-channel sum(x) with its count per channel appended (exact in float64)."""
    return torch.cat([channel_sum(x), torch.tensor([x.numel() // x.shape[1]], dtype=torch.float64)])


def _packed(d: DeviationSums, C: int) -> Tensor:
    """One rank's deviation sums as one (5, C) tensor (no squares: zeros)."""
    squares = d.squares if d.squares is not None else torch.zeros(C, dtype=torch.float64)
    return torch.stack([squares, d.dy, d.dy_xmu, d.abs_dy, d.abs_dy_xmu])


def _exchanged_sums(inputs, grad_outputs, steps, groups, own: int, C: int, exchange: SumOver) -> dict:
    """Every training step's group-wide sums for rank ``own``, which holds only its own tensors: ``{step:
    (first, {own: its DeviationSums}, packed total)}``, in two exchanges for the whole case (the first sums of
    every step, then their deviation sums) whatever its number of steps, each rank calling both."""
    train = [s for s, step in enumerate(steps) if STEP_KINDS[step] == "train"]
    if not train:
        return {}
    unit = next(list(g) for g in groups if own in g)
    firsts = exchange(torch.stack([_first(inputs[s][own]) for s in train]), unit)
    mine, packed = {}, []
    for i, s in enumerate(train):
        n = int(firsts[i][C])
        mean = firsts[i][:C] / n if n else torch.zeros(C, dtype=torch.float64)
        mine[s] = deviation_sums(inputs[s][own], grad_outputs[s][own], mean, squares=True)
        packed.append(_packed(mine[s], C))
    totals = exchange(torch.stack(packed), unit)
    return {s: (firsts[i], {own: mine[s]}, totals[i]) for i, s in enumerate(train)}


def _normalize_unit(truth: StepTruth, unit: list[int], xs: Sequence[Optional[Tensor]],
                    dys: Sequence[Optional[Tensor]], layer: _Layer, buffers: _Buffers,
                    known: Optional[tuple] = None) -> None:
    """Fill ``truth``'s entries of the ranks in ``unit`` (the ranks normalized together) whose tensors are here,
    and update their buffers after a training step.

    ``known``: the unit's sums already exchanged (:func:`_exchanged_sums`), where only this rank's tensors are
    here; else every rank's are, and the sums are made here, in the same order.
    """
    C, f64 = layer.channels, torch.float64
    kind = truth.kind
    use_batch = kind == "train" or not layer.track_running_stats
    here = [r for r in unit if xs[r] is not None]  # every rank of the unit, or (exchanged) this one
    if use_batch:
        # sum(x) per channel and the count, packed (the count is exact in float64).
        first = known[0] if known else sum(_first(xs[r]) for r in unit)
        n = int(first[C])
        mean = first[:C] / n if n else torch.zeros(C, dtype=f64)
    else:
        n = sum(xs[r].numel() // C for r in unit)
        mean, var = buffers.mean[unit[0]], buffers.var[unit[0]]
    if kind == "train" and n == 1:
        truth.raises = ONE_VALUE
    # Every other per-channel sum in one pass over each rank's (x, dy), widened once per slice; summed over the
    # unit in one piece.
    sums = known[1] if known else {r: deviation_sums(xs[r], dys[r], mean, squares=use_batch) for r in here}
    total = known[2] if known else sum(_packed(sums[r], C) for r in unit)
    if use_batch:
        # An empty group normalizes nothing: unit variance keeps its (zero) gradient shares finite.
        var = total[0] / n if n else torch.ones(C, dtype=f64)
    invstd = 1.0 / torch.sqrt(var + layer.eps)
    sum_dy, sum_dy_xmu = total[1], total[2]
    scale = 1.0 / max(n, 1)
    unit_abs_dy = total[3] * scale
    unit_abs_dyx = total[4] * invstd * scale
    for r in here:
        if layer.ranks is None or r in layer.ranks:
            truth.output[r], truth.grad_input[r] = _normalize(xs[r], dys[r], mean, invstd, layer.weight, layer.bias,
                                                              n, sum_dy, sum_dy_xmu, training=use_batch)
        truth.mean[r], truth.invstd[r], truth.count[r] = mean, invstd, n
        truth.mean_abs_dy[r], truth.mean_abs_dy_xhat[r] = unit_abs_dy, unit_abs_dyx
        truth.rank_abs_dy[r], truth.rank_abs_dy_xhat[r] = sums[r].abs_dy, sums[r].abs_dy_xmu * invstd
        if layer.affine:
            truth.grad_weight[r] = sums[r].dy_xmu * invstd
            truth.grad_bias[r] = sums[r].dy
    if kind == "train" and layer.track_running_stats and not layer.frozen_buffers:
        _update_buffers(buffers, here, n, mean, var, layer)


def _update_buffers(buffers: _Buffers, unit: list[int], n: int, mean: Tensor, var: Tensor, layer: _Layer) -> None:
    """A training step's update of the running statistics of the ranks in ``unit``, rounded to the parameter
    dtype as every implementation stores them."""
    for r in unit:
        buffers.tracked[r] += 1
        if n == 0:
            continue  # an empty global batch counts the step and leaves the statistics alone
        factor = 1.0 / buffers.tracked[r] if layer.momentum is None else layer.momentum
        unbiased = var * n / (n - 1) if n > 1 else torch.full((layer.channels,), float("inf"), dtype=torch.float64)
        buffers.mean[r] = ((1 - factor) * buffers.mean[r] + factor * mean).to(layer.param_dtype).to(torch.float64)
        buffers.var[r] = ((1 - factor) * buffers.var[r] + factor * unbiased).to(layer.param_dtype).to(torch.float64)
