#!/usr/bin/env python3
# Reproduction of SyncBatchNorm case search/float32-float32/contiguous/empty-0-2/c1x1x1/momentum-none/train/ws2-907e69f4 for fairscale.experimental.nn:SyncBatchNorm.
# Written by syncbn-harness 0.1.0 on 2026-11-25T13:31:20+00:00 (syncbn-harness search --impl torch --impl fairscale.experimental.nn:SyncBatchNorm --budget 5m --seed 0 --device cpu --out /tmp/runs2/torch-fairscale).
#
# Observed: error: rank 0: error (RuntimeError: _track_running_stats() Expected a value of type 'float' for argument 'momentum' but instead found type 'NoneType'.); rank 1: error (RuntimeError: _track_running_stats() Expected a value of type 'float' for argument 'momentum' but instead found type 'NoneType'.)
#   on torch 2.13.0+cpu (git cf30153c4c131c8164ee7798e5022d810682e2cb), CUDA None, device cpu, backend gloo, fairscale.experimental.nn:SyncBatchNorm 
#   host vm, 2026-11-25T13:30:36+00:00.
# Found with: syncbn-harness check --impl fairscale.experimental.nn:SyncBatchNorm --case search/float32-float32/contiguous/empty-0-2/c1x1x1/momentum-none/train/ws2-907e69f4 --device cpu
#
# Case parameters: {"dtype": "float32", "param_dtype": "float32", "memory_format": "contiguous", "grad_memory_format": "contiguous", "ndim": 4, "batch_sizes": [0, 2], "spatial": [[1, 1], [1, 1]], "channels": 1, "world_size": 2, "affine": true, "track_running_stats": true, "momentum": null, "eps": 1e-05, "steps": ["train"], "groups": null, "input_mean": 0.0, "input_scale": 1.0, "seed": 0, "model": null, "scenario": "layer", "step_batch_sizes": null, "input_layout": "dense", "optimizer": null, "ddp": [], "backend": null, "compile": []}
# Inputs are regenerated from the seed; the oracle is batch normalization over the global batch in
# float64; tolerances are the harness's (dtype unit roundoff, reduction size; see compare below).
# Runs on cpu (gloo): python FILE, or torchrun --nproc-per-node=2 FILE.
# Exit 0: agrees with the oracle. Exit 1: the disagreement is printed. Exit 2: cannot run here.
# The implementation is imported by name: fairscale.experimental.nn:SyncBatchNorm (found in /work/main/.venv/lib/python3.11/site-packages when written; that folder is a fallback on sys.path).
"""Standalone reproduction of search/float32-float32/contiguous/empty-0-2/c1x1x1/momentum-none/train/ws2-907e69f4 for fairscale.experimental.nn:SyncBatchNorm; run: python repro-9.py (or under torchrun)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional
import enum
from dataclasses import asdict, dataclass, field, fields
SCHEMA_VERSION = 1
import zlib
from typing import Optional
import torch
from dataclasses import dataclass, field
from typing import Optional, Sequence
from dataclasses import dataclass, field, fields
import contextlib
import functools
import json
import os
import re
from pathlib import Path
from collections import OrderedDict
import datetime
import logging
import signal
import time
import traceback
import sys
compiled = sys.modules[__name__]
nccl_contract = sys.modules[__name__]
import abc
from typing import NamedTuple, Optional
import importlib
import tempfile


# ---- harness/judge/metric.py, verbatim -------------------------------------


def _encode(x: float):
    return float(x) if math.isfinite(x) else str(float(x))


def _decode(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


@dataclass(frozen=True)
class Metric:
    """One compared tensor: its largest errors, the tolerance at its worst element, and err/tol there.

    ``ratio <= 1`` passes. ``problem`` is a structural mismatch (wrong dtype,
    shape or memory format, NaN/Inf where the truth is finite, an invariant
    broken) that fails whatever the numbers say.
    """

    max_abs_err: float
    max_rel_err: float
    tol: float
    ratio: float
    problem: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.problem is None and self.ratio <= 1.0

    @classmethod
    def failure(cls, problem: str) -> "Metric":
        """A structural mismatch: no numbers to compare, only what is wrong."""
        return cls(math.nan, math.nan, 0.0, math.inf, problem)

    def to_dict(self) -> dict:
        return {"max_abs_err": _encode(self.max_abs_err), "max_rel_err": _encode(self.max_rel_err),
                "tol": _encode(self.tol), "ratio": _encode(self.ratio), "ok": self.ok, "problem": self.problem}

    @classmethod
    def from_dict(cls, d: dict) -> "Metric":
        return cls(_decode(d.get("max_abs_err")), _decode(d.get("max_rel_err")), _decode(d.get("tol")),
                   _decode(d.get("ratio")), d.get("problem"))

    def describe(self) -> str:
        """``max abs err 0.0327 > tol 3.49e-05 (938x)``, or the problem."""
        if self.problem:
            return self.problem
        return f"max abs err {self.max_abs_err:.3g} > tol {self.tol:.3g} ({self.ratio:.3g}x)"


def worst_ratio(metrics: Iterable[Metric]) -> Optional[float]:
    """The largest err/tol ratio among ``metrics`` (None when there are none; NaN ignored, Inf kept)."""
    ratios = [m.ratio for m in metrics if not math.isnan(m.ratio)]
    return max(ratios) if ratios else None


# ---- harness/results/records.py: RankStatus and what they use, verbatim ----


class RankStatus(str, enum.Enum):
    """What one rank did during a case. ``PEER_FAILED``: stopped because a sibling failed, not blamed."""

    PASS = "pass"
    MISMATCH = "mismatch"
    ERROR = "error"
    CRASH = "crash"
    HANG = "hang"
    PEER_FAILED = "peer-failed"

    def __str__(self) -> str:
        return self.value


# ---- harness/catalog/case.py, verbatim -------------------------------------


STEP_KINDS = {"train": "train", "fwd": "train", "nograd": "train", "eval": "eval", "eval-rank0": "eval"}


INPUT_LAYOUTS = ("dense", "permuted", "sliced")


CASE_BACKENDS = (None, "nccl-contract")  # None: the run's backend


COMPILE_BACKENDS = ("eager", "aot_eager", "inductor")


COMPILE_OPTIONS = ("fullgraph", "dynamic")


DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}


MEMORY_FORMATS = {
    "contiguous": torch.contiguous_format,
    "channels_last": torch.channels_last,
    "channels_last_3d": torch.channels_last_3d,
}


def seed_of(case_id: str) -> int:
    """The seed a case derives from its id (a family may give a variant its twin's, to share the data)."""
    return zlib.crc32(case_id.encode()) & 0x7FFFFFFF


@dataclass(frozen=True)
class Case:
    """One SyncBN scenario. ``id`` is stable and starts with the family name."""

    id: str
    family: str
    batch_sizes: tuple[int, ...]
    spatial: tuple[tuple[int, ...], ...]  # per rank; all of length ndim - 2
    channels: int = 8
    dtype: str = "float32"
    param_dtype: str = "float32"
    memory_format: str = "contiguous"
    grad_memory_format: Optional[str] = None
    affine: bool = True
    track_running_stats: bool = True
    momentum: Optional[float] = 0.1
    eps: float = 1e-5
    steps: tuple[str, ...] = ("train",)
    groups: Optional[tuple[tuple[int, ...], ...]] = None  # process subgroups partitioning the ranks
    input_mean: float = 0.0  # inputs ~ input_mean + input_scale * (channel offset + N(0, 1))
    input_scale: float = 1.0
    constant_channels: tuple[int, ...] = ()  # channels whose input is constant (zero variance)
    model: Optional[str] = None  # "nested": the layer sits in a nested model converted by the implementation
    scenario: str = "layer"  # what a rank does with the case (a module of harness.scenarios)
    step_batch_sizes: Optional[tuple[tuple[int, ...], ...]] = None  # per step and rank, when sizes change
    input_layout: str = "dense"  # "permuted" / "sliced": the input is a view dense in no memory format
    optimizer: Optional[str] = None  # model scenarios: "sgd" (with momentum) or "adam"
    ddp: tuple[str, ...] = ()  # model scenarios under DistributedDataParallel: its flags (see scenarios.model)
    # Conversion cases: a checkpoint round trip between two phases of the steps (see harness.scenarios.checkpoint).
    checkpoint: Optional[str] = None
    # The process-group backend of this case when it is not the run's: "nccl-contract" runs torch's non-gloo
    # code path on CPU (see harness.engine.nccl_contract).
    backend: Optional[str] = None
    # Run the case's module under torch.compile, and eagerly beside it (see harness.engine.compiled):
    # (backend, *options), e.g. ("aot_eager", "fullgraph"); () runs eagerly only.
    compile: tuple[str, ...] = ()
    seed: int = -1  # -1: derived from the id, so a case's data never changes with catalog order
    default: bool = True  # in the default selection (else only with --exhaustive)
    note: str = ""

    def __post_init__(self) -> None:
        if len(self.spatial) != len(self.batch_sizes):
            raise ValueError(f"case {self.id}: one spatial shape per rank needed")
        if len({len(s) for s in self.spatial}) != 1:
            raise ValueError(f"case {self.id}: every rank needs the same number of dims")
        if self.dtype not in DTYPES or self.param_dtype not in DTYPES:
            raise ValueError(f"case {self.id}: dtype must be one of {sorted(DTYPES)}")
        if self.memory_format not in MEMORY_FORMATS:
            raise ValueError(f"case {self.id}: memory_format must be one of {sorted(MEMORY_FORMATS)}")
        if any(k not in STEP_KINDS for k in self.steps):
            raise ValueError(f"case {self.id}: steps are {', '.join(STEP_KINDS)}, got {self.steps}")
        if self.steps and self.steps[-1] == "fwd" or any(a == "fwd" and b != "train"
                                                          for a, b in zip(self.steps, self.steps[1:])):
            raise ValueError(f"case {self.id}: a 'fwd' step must be followed by the 'train' step of its backward")
        if self.step_batch_sizes is not None and (len(self.step_batch_sizes) != len(self.steps) or any(
                len(b) != len(self.batch_sizes) for b in self.step_batch_sizes)):
            raise ValueError(f"case {self.id}: step_batch_sizes needs one size per rank for every step")
        if self.input_layout not in INPUT_LAYOUTS:
            raise ValueError(f"case {self.id}: input_layout must be one of {INPUT_LAYOUTS}")
        if not self.id.startswith(self.family + "/"):
            raise ValueError(f"case id {self.id!r} must start with its family {self.family!r}/")
        if self.backend not in CASE_BACKENDS:
            raise ValueError(f"case {self.id}: backend must be one of {CASE_BACKENDS}")
        if self.compile and (self.compile[0] not in COMPILE_BACKENDS or len(set(self.compile[1:])) != len(
                self.compile) - 1 or any(o not in COMPILE_OPTIONS for o in self.compile[1:])):
            raise ValueError(f"case {self.id}: compile is (backend, *options) with a backend of {COMPILE_BACKENDS} "
                             f"and options among {COMPILE_OPTIONS}, got {self.compile}")
        if self.seed < 0:
            object.__setattr__(self, "seed", seed_of(self.id))

    def on_backend(self, backend: str, *, default: Optional[bool] = None) -> "Case":
        """This case over ``backend`` instead of the run's: the id gets ``/<backend>``, the data stays the same."""
        from dataclasses import replace

        return replace(self, id=f"{self.id}/{backend}", backend=backend, seed=self.seed,
                       default=self.default if default is None else default)

    def backend_for(self, run_backend: str) -> str:
        """The backend this case runs on in a run over ``run_backend``."""
        return self.backend or run_backend

    @property
    def world_size(self) -> int:
        return len(self.batch_sizes)

    @property
    def ndim(self) -> int:
        return 2 + len(self.spatial[0])

    def params(self) -> dict:
        """The flat parameter dict every record carries (names as in torch: dtype ``"float16"``, ...)."""
        return {
            "dtype": self.dtype,
            "param_dtype": self.param_dtype,
            "memory_format": self.memory_format,
            "grad_memory_format": self.grad_memory_format or self.memory_format,
            "ndim": self.ndim,
            "batch_sizes": list(self.batch_sizes),
            "spatial": [list(s) for s in self.spatial],
            "channels": self.channels,
            "world_size": self.world_size,
            "affine": self.affine,
            "track_running_stats": self.track_running_stats,
            "momentum": self.momentum,
            "eps": self.eps,
            "steps": list(self.steps),
            "groups": [list(g) for g in self.groups] if self.groups else None,
            "input_mean": self.input_mean,
            "input_scale": self.input_scale,
            "seed": self.seed,
            "model": self.model,
            "scenario": self.scenario,
            "step_batch_sizes": [list(b) for b in self.step_batch_sizes] if self.step_batch_sizes else None,
            "input_layout": self.input_layout,
            "optimizer": self.optimizer,
            "ddp": list(self.ddp),
            "backend": self.backend,
            "compile": list(self.compile),
        }

    def sizes_at(self, step: int) -> tuple[int, ...]:
        """Every rank's batch size at ``step``."""
        return self.step_batch_sizes[step] if self.step_batch_sizes else self.batch_sizes

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Case":
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        for key in ("batch_sizes", "steps", "constant_channels", "ddp", "compile"):
            if key in kw:
                kw[key] = tuple(kw[key])
        if kw.get("step_batch_sizes") is not None:
            kw["step_batch_sizes"] = tuple(tuple(b) for b in kw["step_batch_sizes"])
        kw["spatial"] = tuple(tuple(s) for s in kw["spatial"])
        if kw.get("groups") is not None:
            kw["groups"] = tuple(tuple(g) for g in kw["groups"])
        return cls(**kw)

    def group_of(self, rank: int) -> tuple[int, ...]:
        for g in self.groups or (tuple(range(self.world_size)),):
            if rank in g:
                return tuple(g)
        raise ValueError(f"rank {rank} is in no group of case {self.id}")


@dataclass
class CaseData:
    """The tensors of a case, on CPU, already in their dtypes and layouts."""

    inputs: list[list[torch.Tensor]]  # [step][rank]
    grad_outputs: list[list[torch.Tensor]]
    weight: torch.Tensor
    bias: torch.Tensor
    running_mean: torch.Tensor
    running_var: torch.Tensor
    extra: dict = field(default_factory=dict)


def materialize(case: Case) -> CaseData:
    """Regenerate the case's tensors from its seed (same result in every process)."""
    gen = torch.Generator().manual_seed(case.seed)
    C = case.channels
    dtype = DTYPES[case.dtype]
    pdtype = DTYPES[case.param_dtype]
    fmt = MEMORY_FORMATS[case.memory_format]
    gfmt = MEMORY_FORMATS[case.grad_memory_format or case.memory_format]
    # Per-channel offsets and scales, so channels differ in mean and spread.
    chan_off = torch.randn(C, generator=gen, dtype=torch.float64)
    chan_scale = torch.rand(C, generator=gen, dtype=torch.float64) * 1.5 + 0.5
    # Affine parameters of both signs and varied magnitude, never ones and zeros.
    sign = torch.where(torch.rand(C, generator=gen) < 0.3, -1.0, 1.0).double()
    weight = (sign * (torch.rand(C, generator=gen, dtype=torch.float64) * 1.5 + 0.25)).to(pdtype)
    bias = (torch.randn(C, generator=gen, dtype=torch.float64) * 0.5).to(pdtype)
    running_mean = (torch.randn(C, generator=gen, dtype=torch.float64) * 0.1).to(pdtype)
    running_var = (torch.rand(C, generator=gen, dtype=torch.float64) * 0.5 + 0.75).to(pdtype)
    inputs, grads = [], []
    for s in range(len(case.steps)):
        xs, gs = [], []
        for n, sp in zip(case.sizes_at(s), case.spatial):
            shape = (n, C, *sp)
            bshape = (1, C) + (1,) * len(sp)
            z = torch.randn(shape, generator=gen, dtype=torch.float64)
            x = case.input_mean + case.input_scale * (chan_off.view(bshape) + chan_scale.view(bshape) * z)
            for c in case.constant_channels:
                x[:, c] = case.input_mean + case.input_scale * float(chan_off[c])
            g = torch.randn(shape, generator=gen, dtype=torch.float64)
            xs.append(_layout(x.to(dtype), fmt))
            gs.append(_layout(g.to(dtype), gfmt))
        inputs.append(xs)
        grads.append(gs)
    return CaseData(inputs, grads, weight, bias, running_mean, running_var)


def _layout(t: torch.Tensor, fmt: torch.memory_format) -> torch.Tensor:
    if fmt is torch.channels_last and t.dim() != 4:
        return t.contiguous()
    if fmt is torch.channels_last_3d and t.dim() != 5:
        return t.contiguous()
    return t.contiguous(memory_format=fmt)


# ---- harness/judge/oracle.py, verbatim -------------------------------------


Tensor = torch.Tensor


CHUNK = 1 << 22  # elements widened to float64 at a time by the per-channel reductions


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


def _bcast(v: Tensor, like: Tensor) -> Tensor:
    return v.view(1, -1, *([1] * (like.dim() - 2)))


def _slices(x: Tensor):
    """``x`` cut along the batch into slices of at most :data:`CHUNK` elements (one sample at least)."""
    per_sample = max(x[0].numel(), 1) if x.shape[0] else 1
    step = max(1, CHUNK // per_sample)
    for i in range(0, x.shape[0], step):
        yield i, min(i + step, x.shape[0])


def channel_sum(x: Tensor, fn=None, y: Optional[Tensor] = None) -> Tensor:
    """Per-channel float64 sum over (N, *spatial) of ``fn(x)`` (or ``fn(x, y)``), a slice at a time."""
    dims = [0] + list(range(2, x.dim()))
    total = torch.zeros(x.shape[1], dtype=torch.float64)
    for a, b in _slices(x):
        xs = x[a:b].detach().to(torch.float64)
        if y is not None:
            v = fn(xs, y[a:b].detach().to(torch.float64))
        else:
            v = fn(xs) if fn is not None else xs
        total += v.sum(dim=dims)
    return total


def _normalize(x: Tensor, dy: Tensor, mean: Tensor, invstd: Tensor, w: Tensor, b: Tensor,
               count: int, sum_dy: Tensor, sum_dy_xmu: Tensor, training: bool):
    """Forward output and input gradient of one rank (all float64)."""
    x64 = x.detach().to(torch.float64)
    dy64 = dy.detach().to(torch.float64)
    xmu = x64 - _bcast(mean, x64)
    out = xmu * _bcast(invstd * w, x64) + _bcast(b, x64)
    if training:
        grad_mean = sum_dy / count
        proj = sum_dy_xmu / count * invstd * invstd
        gin = (dy64 - _bcast(grad_mean, x64) - xmu * _bcast(proj, x64)) * _bcast(invstd * w, x64)
    else:
        gin = dy64 * _bcast(invstd * w, x64)
    return out, gin


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
) -> list[StepTruth]:
    """Exact results of every step of a case.

    ``inputs[s][r]`` and ``grad_outputs[s][r]`` are rank ``r``'s tensors at step
    ``s``; ``groups`` partitions the ranks into process groups (default: one
    group of all ranks). ``weight``/``bias`` are the initial affine parameters
    (default ones/zeros), ``running_mean``/``running_var`` the initial buffers
    (default zeros/ones). ``ranks``: the ranks whose output and grad_input are
    wanted (default: every rank); the others' are None.
    """
    if len(inputs) != len(steps) or len(grad_outputs) != len(steps):
        raise ValueError(f"need one input list and one grad list per step: {len(steps)} steps, "
                         f"{len(inputs)} inputs, {len(grad_outputs)} grads")
    world = len(inputs[0])
    groups = [list(g) for g in (groups or [list(range(world))])]
    if sorted(r for g in groups for r in g) != list(range(world)):
        raise ValueError(f"groups {groups} must partition ranks 0..{world - 1}")
    C = num_features
    f64 = torch.float64
    w = weight.detach().to(f64) if affine and weight is not None else torch.ones(C, dtype=f64)
    b = bias.detach().to(f64) if affine and bias is not None else torch.zeros(C, dtype=f64)

    def buffer(v: Optional[Tensor], default: float) -> Tensor:
        t = v.detach().to(f64) if v is not None else torch.full((C,), default, dtype=f64)
        return t.to(param_dtype).to(f64)

    # Buffers per rank: ranks of different groups track different statistics.
    rm = [buffer(running_mean, 0.0) for _ in range(world)] if track_running_stats else [None] * world
    rv = [buffer(running_var, 1.0) for _ in range(world)] if track_running_stats else [None] * world
    nbt = [0] * world if track_running_stats else [None] * world

    truths = []
    for s, step in enumerate(steps):
        if step not in STEP_KINDS:
            raise ValueError(f"unknown step {step!r}: steps are {', '.join(STEP_KINDS)}")
        kind = STEP_KINDS[step]  # what the normalization does: batch statistics ("train") or running ones
        xs, dys = inputs[s], grad_outputs[s]
        out: list = [None] * world
        gin: list = [None] * world
        gw: list = [None] * world
        gb: list = [None] * world
        means: list = [None] * world
        invstds: list = [None] * world
        counts: list = [0] * world
        abs_dy: list = [None] * world
        abs_dy_xhat: list = [None] * world
        use_batch = kind == "train" or not track_running_stats
        for group in groups:
            sync = kind == "train"
            # Statistics: over the whole group in training, per rank when eval lacks buffers.
            units = [group] if sync else [[r] for r in group]
            for unit in units:
                n = sum(xs[r].numel() // C for r in unit)
                if use_batch:
                    mean = sum(channel_sum(xs[r]) for r in unit) / n if n else torch.zeros(C, dtype=f64)
                    nan = torch.full((C,), float("nan"), dtype=f64)
                    var = sum(channel_sum(xs[r], lambda v, m=mean: (v - _bcast(m, v)) ** 2) for r in unit) / n \
                        if n else nan
                else:
                    mean, var = rm[unit[0]], rv[unit[0]]
                invstd = 1.0 / torch.sqrt(var + eps)
                dy_sums = {r: channel_sum(dys[r]) for r in unit}
                dyx_sums = {r: channel_sum(xs[r], lambda v, d, m=mean: d * (v - _bcast(m, v)), dys[r]) for r in unit}
                sum_dy = sum(dy_sums.values())
                sum_dy_xmu = sum(dyx_sums.values())
                scale = 1.0 / max(n, 1)
                unit_abs_dy = sum(channel_sum(dys[r], torch.abs) for r in unit) * scale
                unit_abs_dyx = sum(channel_sum(xs[r], lambda v, d, m=mean: (d * (v - _bcast(m, v))).abs(), dys[r])
                                   for r in unit) * invstd * scale
                for r in unit:
                    if ranks is None or r in ranks:
                        out[r], gin[r] = _normalize(xs[r], dys[r], mean, invstd, w, b, n, sum_dy, sum_dy_xmu,
                                                    training=use_batch)
                    means[r], invstds[r], counts[r] = mean, invstd, n
                    abs_dy[r], abs_dy_xhat[r] = unit_abs_dy, unit_abs_dyx
                    if affine:
                        gw[r] = dyx_sums[r] * invstd
                        gb[r] = dy_sums[r]
                if kind == "train" and track_running_stats:
                    for r in unit:
                        nbt[r] += 1
                        factor = 1.0 / nbt[r] if momentum is None else momentum
                        unbiased = var * n / (n - 1) if n > 1 else torch.full((C,), float("inf"), dtype=f64)
                        rm[r] = ((1 - factor) * rm[r] + factor * mean).to(param_dtype).to(f64)
                        rv[r] = ((1 - factor) * rv[r] + factor * unbiased).to(param_dtype).to(f64)
        truths.append(StepTruth(
            kind=kind,
            output=out,
            grad_input=gin,
            grad_weight=gw,
            grad_bias=gb,
            grad_weight_sum=torch.stack(gw).sum(0) if affine else None,
            grad_bias_sum=torch.stack(gb).sum(0) if affine else None,
            running_mean=[t.clone() if t is not None else None for t in rm],
            running_var=[t.clone() if t is not None else None for t in rv],
            num_batches_tracked=list(nbt),
            mean=means,
            invstd=invstds,
            count=counts,
            mean_abs_dy=abs_dy,
            mean_abs_dy_xhat=abs_dy_xhat,
        ))
    return truths


# ---- harness/judge/compare.py, verbatim ------------------------------------


K = 8.0


UNIT_ROUNDOFF = {
    torch.float16: 2.0**-11,
    torch.bfloat16: 2.0**-8,
    torch.float32: 2.0**-24,
    torch.float64: 2.0**-53,
}


TINY = 1e-300


def gamma(n: int) -> float:
    """Rounding-error growth of a reduction over ``n`` terms, in unit roundoffs."""
    return 2.0 * math.sqrt(max(n, 1)) + 2.0


def compare_tensor(got: Optional[torch.Tensor], true: torch.Tensor, tol: torch.Tensor, *,
                   dtype: Optional[torch.dtype] = None,
                   memory_format: Optional[torch.memory_format] = None) -> Metric:
    """Compare ``got`` with the float64 ``true`` elementwise against the final tolerance ``tol``."""
    if got is None:
        got = torch.zeros_like(true)  # a missing gradient is a gradient of zeros
    elif dtype is not None and got.dtype != dtype:
        return Metric.failure(f"dtype {got.dtype}, expected {dtype}")
    if tuple(got.shape) != tuple(true.shape):
        return Metric.failure(f"shape {tuple(got.shape)}, expected {tuple(true.shape)}")
    if memory_format is not None and got.dim() in (4, 5) and got.numel() > 0 \
            and not got.is_contiguous(memory_format=memory_format):
        return Metric.failure(f"output not in {memory_format}")
    g = got.detach().to(torch.float64).cpu()
    t = true.to(torch.float64)
    tol = torch.broadcast_to(tol.to(torch.float64), t.shape)
    if t.numel() == 0:
        return Metric(0.0, 0.0, 0.0, 0.0)
    finite = torch.isfinite(t)
    if dtype is not None and dtype.is_floating_point and dtype != torch.float64:
        # A true value beyond the dtype's range rounds to infinity: +-inf (or +-max) of its sign is exact there.
        big = torch.finfo(dtype).max
        overflow = finite & (t.abs() > big) & ((g.abs() == math.inf) | (g.abs() == big)) & (g.sign() == t.sign())
        finite = finite & ~overflow
    bad = finite & ~torch.isfinite(g)
    if bool(bad.any()):
        return Metric(math.inf, math.inf, 0.0, math.inf, f"{int(bad.sum())} non-finite values where the oracle "
                                                           "is finite")
    err = torch.where(finite, (g - t).abs(), torch.zeros_like(t))
    rel = err / t.abs().clamp_min(TINY)
    ratio = err / tol.clamp_min(TINY)
    ratio = torch.where(err == 0, torch.zeros_like(ratio), ratio)
    worst = int(ratio.reshape(-1).argmax())
    return Metric(float(err.max()), float(rel.max()), float(tol.reshape(-1)[worst]), float(ratio.reshape(-1)[worst]))


def _chan(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return v.view(1, -1, *([1] * (like.dim() - 2)))


def _dims(x: torch.Tensor) -> list[int]:
    return [0] + list(range(2, x.dim()))


class Budget:
    """The tolerances of one case (see the module docstring); every method returns a final tolerance (x K)."""

    def __init__(self, case: Case):
        self.case = case
        self.dtype = DTYPES[case.dtype]
        self.pdtype = DTYPES[case.param_dtype]
        self.u_in = UNIT_ROUNDOFF[self.dtype]
        self.u_p = UNIT_ROUNDOFF[self.pdtype]
        both64 = self.dtype == torch.float64 and self.pdtype == torch.float64
        self.u_a = UNIT_ROUNDOFF[torch.float64 if both64 else torch.float32]

    @staticmethod
    def stats_factor(mean: torch.Tensor, invstd: torch.Tensor) -> torch.Tensor:
        """``1 + invstd |mu|``: statistics are exact up to rounding relative to the mean, not the spread."""
        return 1.0 + invstd * mean.abs()

    def grad_weight_share(self, x, dy, mu, invstd, g_N: float) -> torch.Tensor:
        """Unscaled budget of one rank's grad_weight share (without the parameter dtype's rounding)."""
        if not x.numel():
            return torch.zeros_like(mu)
        sf = self.stats_factor(mu, invstd)
        n = x.numel() // x.shape[1]
        xhat = (x - _chan(mu, x)) * _chan(invstd, x)
        return ((self.u_in + self.u_a * (gamma(n) + g_N) * sf) * (dy * xhat).abs().sum(dim=_dims(x))
                + self.u_a * g_N * sf * dy.abs().sum(dim=_dims(x)))

    def running(self, truths, rank: int) -> list[tuple]:
        """Per step, the unscaled running-statistics budgets ``(rm_tol, rv_tol)`` before and after it.

        Each update adds the rounding of the update (in the accumulation type when it is wider than the
        buffers': torch's CUDA gather updates float64 buffers of float32 input in float32) and the batch
        statistics' error times the momentum factor; budgets of earlier steps decay by (1 - f) but never
        vanish, so they are kept. ``(None, None)`` before the first update or without running statistics.
        """
        case = self.case
        out = []
        train_steps = 0
        rm_tol = rv_tol = None
        u_upd = max(self.u_p, self.u_a)
        for truth in truths:
            before = (rm_tol, rv_tol)
            if case.track_running_stats:
                train = truth.kind == "train"
                train_steps += train
                mu, invstd, N = truth.mean[rank], truth.invstd[rank], truth.count[rank]
                f = (1.0 / train_steps if case.momentum is None else case.momentum) if train_steps else 0.0
                rm_true, rv_true = truth.running_mean[rank], truth.running_var[rank]
                var = 1.0 / (invstd * invstd) - case.eps if train else rv_true
                step_rm = u_upd * max(train_steps, 1) * (rm_true.abs() + (mu.abs() if train else 0))
                step_rv = u_upd * max(train_steps, 1) * (rv_true.abs() + (var.abs() if train else 0))
                if train:
                    g_N = gamma(N)
                    step_rm = step_rm + self.u_a * g_N * f * (mu.abs() + var.clamp_min(0).sqrt())
                    step_rv = step_rv + 2 * self.u_a * g_N * f * (var.abs() + case.eps) * self.stats_factor(mu,
                                                                                                            invstd)
                rm_tol = step_rm if rm_tol is None else torch.maximum(rm_tol, step_rm)
                rv_tol = step_rv if rv_tol is None else torch.maximum(rv_tol, step_rv)
            out.append((before, (rm_tol, rv_tol)))
        return out

    @staticmethod
    def eval_grad_weight(x, dy, mu, invstd, before: tuple) -> torch.Tensor:
        """What an eval step's grad_weight share adds for the running statistics it normalized with
        (d gw / d rm = -invstd sum dy; d gw / d rv = -invstd^2 sum dy xhat / 2)."""
        rm_tol, rv_tol = before
        if rm_tol is None or not x.numel():
            return torch.zeros_like(mu)
        xhat = (x - _chan(mu, x)) * _chan(invstd, x)
        return rm_tol * invstd * dy.abs().sum(dim=_dims(x)) + 0.5 * rv_tol * invstd ** 2 * (dy * xhat).abs().sum(
            dim=_dims(x))

    def grad_bias_share(self, x, dy) -> torch.Tensor:
        """Unscaled budget of one rank's grad_bias share (without the parameter dtype's rounding)."""
        if not x.numel():
            return torch.zeros(x.shape[1], dtype=torch.float64)
        n = x.numel() // x.shape[1]
        return (self.u_in + self.u_a * gamma(n)) * dy.abs().sum(dim=_dims(x))


def judge_rank(case: Case, rank: int, data, truths, observed: list[dict]) -> list[tuple[str, Metric]]:
    """Compare rank ``rank``'s observed tensors of every step with the oracle.

    ``observed[s]`` holds ``output``, ``grad_input``, ``grad_weight``,
    ``grad_bias``, ``running_mean``, ``running_var``, ``num_batches_tracked``
    (tensors or None) after step ``s``, or is None where the rank took no part
    in the step. ``grads`` says whose gradients it holds: ``own`` (its
    backward), ``none`` (no backward), ``deferred`` (the parameters' come with
    a later step), ``accumulated`` (the parameters' are the sum over
    ``grad_steps``). ``layout_checked`` False: the input was a view dense in no
    memory format, so no output layout is required.
    """
    b = Budget(case)
    fmt = MEMORY_FORMATS[case.memory_format]
    out: list[tuple[str, Metric]] = []
    w = data.weight.double() if case.affine else torch.ones(case.channels, dtype=torch.float64)
    bias = data.bias.double() if case.affine else torch.zeros(case.channels, dtype=torch.float64)
    running = b.running(truths, rank)  # unscaled running-statistics budgets before and after each step
    shares: list = []  # per step: this rank's true grad_weight/grad_bias shares and their unscaled budgets
    for s, (truth, obs) in enumerate(zip(truths, observed)):
        x = data.inputs[s][rank].double()
        dy = data.grad_outputs[s][rank].double()
        mu, invstd, N = truth.mean[rank], truth.invstd[rank], truth.count[rank]
        train = truth.kind == "train"
        rm_tol, rv_tol = running[s][0]
        sf = b.stats_factor(mu, invstd)
        # Batch statistics (a reduction over N) normalize in training, and in eval without running statistics.
        g_N = gamma(N) if train or not case.track_running_stats else 1.0
        if case.affine:
            gw_budget = b.grad_weight_share(x, dy, mu, invstd, g_N)
            if not train and case.track_running_stats:
                # Eval normalizes with the implementation's running statistics: carry their budget.
                gw_budget = gw_budget + b.eval_grad_weight(x, dy, mu, invstd, running[s][0])
            shares.append((truth.grad_weight[rank], truth.grad_bias[rank], gw_budget, b.grad_bias_share(x, dy)))
        if obs is None:
            continue  # this rank takes no part in the step (evaluation on rank 0 alone)
        xhat = (x - _chan(mu, x)) * _chan(invstd, x)
        y = truth.output[rank]
        tol_y = (b.u_in * (y.abs() + _chan(w.abs(), x) * xhat.abs() + _chan(bias.abs(), x))
                 + b.u_a * g_N * _chan(w.abs() * sf, x) * (1 + xhat.abs()))
        if not train and rm_tol is not None:
            # Eval normalizes with the implementation's running statistics: carry their budget.
            tol_y = tol_y + _chan(w.abs() * invstd * (rm_tol + 0.5 * rv_tol * invstd), x) * (1 + xhat.abs())
        tag = f"step{s}.{truth.kind}"
        expected_format = fmt if obs.get("layout_checked", True) else None
        out.append((f"{tag}.output", compare_tensor(obs["output"], y, K * tol_y, dtype=b.dtype,
                                                     memory_format=expected_format)))
        grads = obs.get("grads", "own")  # own | none (no backward) | deferred (a later step's) | accumulated
        if grads != "none":
            if truth.mean_abs_dy and truth.mean_abs_dy[rank] is not None:
                # Means over the values normalized together (the normalization's N), from the oracle.
                mean_abs_dy, mean_abs_dyx = truth.mean_abs_dy[rank], truth.mean_abs_dy_xhat[rank]
            elif x.numel():
                # No group means given: this rank's share as an estimate.
                mean_abs_dy = dy.abs().mean(dim=_dims(x))
                mean_abs_dyx = (dy * xhat).abs().mean(dim=_dims(x))
            else:
                mean_abs_dy = mean_abs_dyx = torch.zeros(case.channels, dtype=torch.float64)
            D = dy.abs() + _chan(mean_abs_dy, x) + xhat.abs() * _chan(mean_abs_dyx, x)
            tol_dx = ((b.u_in + b.u_a * g_N * _chan(sf, x)) * _chan(w.abs() * invstd, x) * D
                      + b.u_in * truth.grad_input[rank].abs())
            if not train and rm_tol is not None:
                tol_dx = tol_dx + _chan(w.abs() * 0.5 * rv_tol * invstd ** 3, x) * dy.abs()
            out.append((f"{tag}.grad_input", compare_tensor(obs["grad_input"], truth.grad_input[rank], K * tol_dx,
                                                             dtype=b.dtype)))
        if case.affine and grads in ("own", "accumulated"):
            steps = obs.get("grad_steps") or [s]
            true_gw = sum(shares[i][0] for i in steps)
            true_gb = sum(shares[i][1] for i in steps)
            tol_gw = sum(shares[i][2] for i in steps) + b.u_p * true_gw.abs()
            tol_gb = sum(shares[i][3] for i in steps) + b.u_p * true_gb.abs()
            out.append((f"{tag}.grad_weight", compare_tensor(obs["grad_weight"], true_gw, K * tol_gw,
                                                              dtype=b.pdtype)))
            out.append((f"{tag}.grad_bias", compare_tensor(obs["grad_bias"], true_gb, K * tol_gb, dtype=b.pdtype)))
        if case.track_running_stats:
            rm_true, rv_true = truth.running_mean[rank], truth.running_var[rank]
            rm_tol, rv_tol = running[s][1]
            out.append((f"{tag}.running_mean", compare_tensor(obs["running_mean"], rm_true, K * rm_tol,
                                                               dtype=b.pdtype)))
            out.append((f"{tag}.running_var", compare_tensor(obs["running_var"], rv_true, K * rv_tol,
                                                              dtype=b.pdtype)))
            got_nbt = obs.get("num_batches_tracked")
            want = truth.num_batches_tracked[rank]
            if got_nbt != want:
                out.append((f"{tag}.num_batches_tracked",
                            Metric.failure(f"num_batches_tracked {got_nbt}, expected {want}")))
    return out


def sum_tolerance(case: Case, data, truths, step: int, which: str) -> torch.Tensor:
    """Final tolerance of the sum over ranks of grad_weight or grad_bias at ``step`` (per channel)."""
    b = Budget(case)
    total = torch.zeros(case.channels, dtype=torch.float64)
    truth = truths[step]
    g_N = None
    for r in range(case.world_size):
        x = data.inputs[step][r].double()
        dy = data.grad_outputs[step][r].double()
        g_N = gamma(truth.count[r]) if truth.kind == "train" or not case.track_running_stats else 1.0
        if which == "grad_weight":
            total += b.grad_weight_share(x, dy, truth.mean[r], truth.invstd[r], g_N)
            if truth.kind != "train" and case.track_running_stats:
                total += b.eval_grad_weight(x, dy, truth.mean[r], truth.invstd[r], b.running(truths, r)[step][0])
        else:
            total += b.grad_bias_share(x, dy)
    true_sum = truth.grad_weight_sum if which == "grad_weight" else truth.grad_bias_sum
    return K * (total + b.u_p * case.world_size * true_sum.abs())


def judge_sums(sum_truth: dict, shares: list[dict]) -> list[tuple[str, Metric]]:
    """Compare the sum over ranks of the grad_weight/grad_bias shares with the oracle's sum.

    ``sum_truth``: ``{step: {which: {"true": [...], "tol": [...]}}}`` (final
    tolerances, from :func:`sum_tolerance`); ``shares``: one
    ``{step: {which: [...]}}`` per rank.
    """
    out = []
    for step, truth in sum_truth.items():
        for which, t in truth.items():
            parts = [s[step][which] for s in shares if step in s]
            if len(parts) != len(shares):
                continue
            got = torch.tensor(parts, dtype=torch.float64).sum(0)
            true = torch.tensor(t["true"], dtype=torch.float64)
            # A share that overflowed its dtype was judged on its rank (infinity is right where the true share
            # is beyond the dtype's range, a failure elsewhere); its channel's sum carries nothing more.
            judged = torch.isfinite(torch.tensor(parts, dtype=torch.float64)).all(0)
            got = torch.where(judged, got, true)
            m = compare_tensor(got, true, torch.tensor(t["tol"], dtype=torch.float64))
            out.append((f"step{step}.{which}_sum", m))
    return out


# ---- harness/engine/messages.py, verbatim ----------------------------------


@dataclass
class Task:
    """One (case, impl) for every rank of a pool or job."""

    case: dict  # Case.to_dict()
    impl: str  # a name harness.impls.resolve takes
    device: str = "cpu"
    compare: Optional[str] = None  # also run this implementation on the same inputs

    def to_dict(self) -> dict:
        return {"case": self.case, "impl": self.impl, "device": self.device, "compare": self.compare}

    @classmethod
    def from_dict(cls, d: dict) -> "Task":
        return cls(case=d["case"], impl=d["impl"], device=d.get("device", "cpu"), compare=d.get("compare"))


@dataclass
class RankResult:
    """What one rank reports of one task: its own verdict, its metrics, and data to judge across ranks.

    ``status`` is ``pass``, ``mismatch`` (some tensor out of tolerance) or
    ``error`` (an exception: type, message and traceback kept). ``across``
    holds what the parent needs to judge the ranks together (the grad_weight
    and grad_bias shares whose sum is compared with the oracle's, digests of
    tensors that must be bitwise equal on every rank of a group).
    """

    rank: int
    status: RankStatus = RankStatus.ERROR
    message: str = ""
    exception_type: Optional[str] = None
    traceback: Optional[str] = None
    metrics: dict[str, Metric] = field(default_factory=dict)
    across: dict = field(default_factory=dict)
    impl_version: Optional[str] = None
    mode: Optional[str] = None
    duration_s: float = 0.0
    compare: Optional[dict] = None
    collectives: Optional[list] = None
    compile: Optional[dict] = None

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["status"] = self.status.value
        d["metrics"] = {name: m.to_dict() for name, m in self.metrics.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "RankResult":
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["status"] = RankStatus(kw.get("status", "error"))
        kw["metrics"] = {name: Metric.from_dict(m) for name, m in (kw.get("metrics") or {}).items()}
        return cls(**kw)


# ---- harness/engine/collectives.py, verbatim -------------------------------


OPS = {
    "all_gather": 1, "all_gather_into_tensor": 1, "_all_gather_base": 1, "all_gather_single": 1, "all_reduce": 0,
    "reduce": 0,
    "broadcast": 0, "reduce_scatter": 0, "reduce_scatter_tensor": 1, "_reduce_scatter_base": 1, "all_to_all": 1,
    "all_to_all_single": 1, "gather": 0, "scatter": 0, "send": 0, "recv": 0, "barrier": None,
    "all_gather_object": None, "broadcast_object_list": None, "gather_object": None,
}


KEYWORDS = ("tensor", "input_tensor", "input", "tensor_list", "object_list")


class CollectiveForbidden(RuntimeError):
    """A collective was issued in a step where no rank may communicate."""


_calls: list[dict] = []


_step: Optional[int] = None


_forbidden: Optional[str] = None


_installed = False


_sink: Optional[int] = None  # file descriptor of the sink file


_wrappers: dict[str, tuple] = {}  # name -> (torch's function, its wrapper)


def install_recorder(sink: Optional[str] = None) -> None:
    """Wrap the collectives in this process (once); a no-op where torch.distributed is unavailable.

    ``sink``: a file that gets every call of the current task as a JSON line, written before the call is issued.
    """
    global _installed, _sink
    if sink is not None and _sink is None:
        _sink = os.open(sink, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    if _installed:
        return
    import torch.distributed as dist

    if not dist.is_available():
        return
    from torch.distributed import distributed_c10d as c10d

    try:  # dynamo's table of the collectives it traces, keyed by torch's functions: made before the wrappers
        import torch.distributed._functional_collectives  # noqa: F401
    except ImportError:  # torch < 2.1
        pass
    for name, arg in OPS.items():
        original = getattr(c10d, name, None) or getattr(dist, name, None)
        if original is None or getattr(original, "__syncbn_wrapped__", False):
            continue
        wrapped = _wrap(name, arg, original)
        _wrappers[name] = (original, wrapped)
        for module in (dist, c10d):
            if getattr(module, name, None) is original:
                setattr(module, name, wrapped)
    _installed = True


@contextlib.contextmanager
def suspended():
    """torch.distributed's own collective functions for the block: nothing is recorded or forbidden there."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    swapped = []
    for name, (original, wrapped) in _wrappers.items():
        for module in (dist, c10d):
            if getattr(module, name, None) is wrapped:
                setattr(module, name, original)
                swapped.append((module, name, wrapped))
    try:
        yield
    finally:
        for module, name, wrapped in swapped:
            setattr(module, name, wrapped)


def _wrap(name: str, arg: Optional[int], original):
    @functools.wraps(original)
    def call(*args, **kwargs):
        entry = describe_call(name, arg, args, kwargs)
        if _forbidden is not None:
            raise CollectiveForbidden(f"{name} issued during {_forbidden} ({_short(entry)}): no rank may talk to "
                                      "another there, so its peers would wait forever")
        _calls.append(entry)
        if _sink is not None:
            os.write(_sink, (json.dumps(entry) + "\n").encode())
        return original(*args, **kwargs)

    call.__syncbn_wrapped__ = True
    return call


def describe_call(name: str, arg: Optional[int], args: tuple, kwargs: dict) -> dict:
    """One call as plain data: op, group ranks, dtype, shape and element count of its tensor, step."""
    import torch

    entry: dict = {"op": name, "group": _group_ranks(kwargs.get("group", _positional_group(name, args))),
                   "step": _step}
    t = None
    if arg is not None:
        t = args[arg] if len(args) > arg else next((kwargs[k] for k in KEYWORDS if k in kwargs), None)
    if isinstance(t, (list, tuple)) and t and isinstance(t[0], torch.Tensor):
        t = t[0]
    if isinstance(t, torch.Tensor):
        entry.update(dtype=str(t.dtype).replace("torch.", ""), shape=list(t.shape), numel=t.numel())
    return entry


def _positional_group(name: str, args: tuple):
    # group is the third positional argument of all_gather/all_reduce/broadcast-style calls
    positions = {"all_reduce": 2, "broadcast": 2, "all_gather": 2, "all_gather_into_tensor": 2,
                 "all_gather_single": 2, "_all_gather_base": 2, "reduce": 3}
    i = positions.get(name)
    return args[i] if i is not None and len(args) > i else None


def _group_ranks(group) -> list[int]:
    import torch.distributed as dist

    try:
        if group is None or group is dist.group.WORLD:
            return list(range(dist.get_world_size()))
        return sorted(dist.get_process_group_ranks(group))
    except Exception:  # noqa: BLE001 - an unknown group is recorded as such, never a reason to fail the call
        return []


def _short(entry: dict) -> str:
    what = f"{entry.get('dtype', '')}{entry.get('shape', '')}" if "dtype" in entry else ""
    return f"{entry['op']} {what} over ranks {entry['group']}".replace("  ", " ")


def begin_task() -> None:
    """Forget earlier calls (and empty the sink): a new task starts."""
    global _step, _forbidden
    _calls.clear()
    if _sink is not None:
        os.ftruncate(_sink, 0)
    _step, _forbidden = None, None


def mark_step(index: Optional[int]) -> None:
    """The calls from now on belong to step ``index`` of the case."""
    global _step
    _step = index


def recorded() -> list[dict]:
    """The calls recorded since :func:`begin_task`, in order."""
    return list(_calls)


def read_sink(path) -> Optional[list[dict]]:
    """The calls a rank wrote to its sink file during its current task (None if there is no such file).

    A line cut short (the process died while writing it) is left out.
    """
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


@contextlib.contextmanager
def forbid_collectives(why: str):
    """Any collective inside the block raises :class:`CollectiveForbidden` (``why`` names the step)."""
    global _forbidden
    previous, _forbidden = _forbidden, why
    try:
        yield
    finally:
        _forbidden = previous


# ---- harness/judge/invariants.py, verbatim ---------------------------------


_INT_OF = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
           torch.float64: torch.int64}


_DTYPE_OF = {str(d).replace("torch.", ""): d for d in _INT_OF}


def bits(t: Optional[torch.Tensor]):
    """A tensor's exact contents as plain data (``None`` stays ``None``; integers are sent as they are)."""
    if t is None:
        return None
    t = t.detach().cpu().contiguous()
    if t.dtype in _INT_OF:
        return {"dtype": str(t.dtype).replace("torch.", ""), "bits": t.view(_INT_OF[t.dtype]).reshape(-1).tolist()}
    return {"dtype": str(t.dtype).replace("torch.", ""), "values": t.reshape(-1).tolist()}


def _ordered(b: list[int], width: int) -> list[int]:
    """Bit patterns mapped to integers in the order of the floats they encode (so a difference counts ULPs)."""
    sign = 1 << (width - 1)
    out = []
    for v in b:
        v &= (1 << width) - 1
        out.append(-(v & (sign - 1)) if v & sign else v)
    return out


def ulps(a: dict, b: dict) -> tuple[int, int]:
    """(elements that differ, the largest distance in units in the last place) between two :func:`bits`."""
    if a.get("dtype") != b.get("dtype"):
        return -1, -1
    if "values" in a or "values" in b:
        diff = [abs(x - y) for x, y in zip(a.get("values", []), b.get("values", []))]
        return sum(d != 0 for d in diff), int(max(diff, default=0))
    width = torch.finfo(_DTYPE_OF[a["dtype"]]).bits
    x, y = _ordered(a["bits"], width), _ordered(b["bits"], width)
    if len(x) != len(y):
        return -1, -1
    diff = [abs(p - q) for p, q in zip(x, y)]
    return sum(d != 0 for d in diff), max(diff, default=0)


def compare_across(name: str, per_rank: dict, groups: Sequence[Sequence[int]]) -> Optional[Metric]:
    """A failing :class:`Metric` if the ranks of some group hold different bits of ``name``, else None."""
    for group in groups:
        present = [r for r in group if per_rank.get(r) is not None]
        if len(present) < 2:
            continue
        first = present[0]
        for r in present[1:]:
            n, worst = ulps(per_rank[first], per_rank[r])
            if n == 0:
                continue
            if n < 0:
                what = f"rank {first} has {per_rank[first].get('dtype')}, rank {r} {per_rank[r].get('dtype')}"
            else:
                unit = "ULPs" if "bits" in per_rank[first] else "counts"
                what = f"{n} element{'s' if n != 1 else ''} differ, by up to {worst} {unit}"
            return Metric.failure(f"{name} differs across ranks: rank {first} vs rank {r}: {what} (a correct "
                                  "SyncBN computes it identically on every rank of a group)")
    return None


# ---- harness/judge/desync.py, verbatim -------------------------------------


def signature(call: dict) -> tuple:
    """What must agree across the ranks of a group: op, dtype, element count (shape may differ, bytes may not)."""
    return call.get("op"), call.get("dtype"), call.get("numel")


def describe(call: Optional[dict], *, op: bool = True) -> str:
    """``all_gather float16[11]``; ``float16[11]`` without the op; ``nothing`` for a missing call."""
    if call is None:
        return "nothing"
    tensor = f"{call['dtype']}{call.get('shape', '')}".replace(" ", "") if call.get("dtype") else ""
    return " ".join(filter(None, [call["op"] if op else "", tensor])) or call["op"]


def eval_checks(case, calls: list[dict]) -> list[tuple[str, Metric]]:
    """A failure per eval step that issued a collective (a rank's own calls)."""
    out = []
    for s, kind in enumerate(case.steps):
        if STEP_KINDS[kind] != "eval":
            continue
        mine = [c for c in calls if c.get("step") == s]
        if mine:
            out.append((f"step{s}.eval.collectives", Metric.failure(
                f"eval issued {len(mine)} collective(s), first {describe(mine[0])} over ranks {mine[0]['group']}: "
                "evaluation uses the running statistics and must not synchronize (validation on one rank would "
                "hang)")))
    return out


def group_checks(case, rank: int, calls: list[dict]) -> list[tuple[str, Metric]]:
    """A failure for the first collective over ranks outside this rank's group (cases with subgroups)."""
    if not case.groups:
        return []
    mine = next((sorted(g) for g in case.groups if rank in g), None)
    for i, c in enumerate(calls):
        if c.get("group") and c["group"] != mine:
            return [("collectives.group", Metric.failure(
                f"collective {i} ({describe(c)}, step {c.get('step')}) went over ranks {c['group']}, not the "
                f"case's group {mine}: the implementation ignored its process_group there"))]
    return []


@dataclass
class Divergence:
    """The first collective on which the ranks of a group disagree."""

    group: list[int]
    index: int  # position among the group's collectives
    calls: dict[int, Optional[dict]]  # rank -> its call there (None: it issued none)
    message: str

    def to_dict(self) -> dict:
        return {"group": self.group, "index": self.index, "message": self.message,
                "calls": {str(r): c for r, c in self.calls.items()}}


def first_divergence(collectives: dict[int, Optional[list]], finished: Iterable[int]) -> Optional[Divergence]:
    """The earliest collective on which the ranks of a group disagree, or None.

    ``collectives``: each rank's calls (None: unknown, such a rank is left out); ``finished``: the ranks that
    completed the case (a missing call counts against them only: the others stopped early for their own reason).
    """
    finished = set(finished)
    known = {r: calls for r, calls in collectives.items() if calls is not None}
    groups = sorted({tuple(c.get("group") or ()) for calls in known.values() for c in calls if c.get("group")})
    found: Optional[Divergence] = None
    for group in groups:
        ranks = [r for r in group if r in known]
        if len(ranks) < 2:
            continue
        seqs = {r: [c for c in known[r] if tuple(c.get("group") or ()) == group] for r in ranks}
        for i in range(max(len(s) for s in seqs.values())):
            at = {r: (s[i] if i < len(s) else None) for r, s in seqs.items()}
            issued = {r: c for r, c in at.items() if c is not None}
            skipped = [r for r, c in at.items() if c is None and r in finished]
            if len({signature(c) for c in issued.values()}) > 1 or (issued and skipped):
                if found is None or i < found.index:
                    found = Divergence(list(group), i, at, _message(list(group), i, at, skipped))
                break
    return found


def _message(group: list[int], index: int, at: dict[int, Optional[dict]], skipped: list[int]) -> str:
    issued = {r: c for r, c in at.items() if c is not None}
    first_rank, first = next(iter(sorted(issued.items())))
    other_rank = next((r for r, c in sorted(issued.items()) if signature(c) != signature(first)), None)
    step = f", step {first.get('step')}" if first.get("step") is not None else ""
    where = f"(collective {index} over ranks {group}{step})"
    if other_rank is not None:
        other = issued[other_rank]
        same_op = other["op"] == first["op"]
        return (f"rank {first_rank} {describe(first)} vs rank {other_rank} {describe(other, op=not same_op)} "
                f"{where}")
    return (f"rank {first_rank} {describe(first)} vs rank {skipped[0]} nothing: it finished the case without this "
            f"collective {where}")


# ---- harness/engine/nccl_contract.py, verbatim -----------------------------


NAME = "nccl-contract"


DELEGATED = ("allgather", "allgather_coalesced", "allreduce", "allreduce_coalesced", "broadcast", "barrier",
             "reduce", "gather", "scatter", "reduce_scatter", "alltoall", "alltoall_base", "send", "recv",
             "recv_anysource", "monitored_barrier")


_registered = False


def _delegate(name: str):
    def call(self, *args, **kwargs):
        return getattr(self.inner, name)(*args, **kwargs)

    call.__name__ = name
    call.__doc__ = f"gloo's {name}, on this group's processes."
    return call


def _flat_views(output, input, world_size: int) -> list:
    """The ``world_size`` slices of a flat all_gather output that NCCL fills, each shaped like ``input``."""
    if output.dtype != input.dtype:
        raise TypeError(f"{NAME}: all_gather into one tensor needs the output in the input's dtype, as NCCL does: "
                        f"output {output.dtype}, input {input.dtype}")
    if output.numel() != world_size * input.numel():
        raise ValueError(f"{NAME}: the output of all_gather into one tensor must hold world_size ({world_size}) "
                         f"times the input's {input.numel()} elements, as NCCL requires: it holds "
                         f"{output.numel()} (shape {list(output.shape)})")
    if not (output.is_contiguous() and input.is_contiguous()):
        raise ValueError(f"{NAME}: all_gather into one tensor needs dense (contiguous) tensors, as NCCL does")
    flat, n = output.view(-1), input.numel()
    return [flat[r * n:(r + 1) * n].view(input.shape) for r in range(world_size)]


@functools.lru_cache(maxsize=None)
def _group_class():
    import torch.distributed as dist

    class NcclContractGroup(dist.ProcessGroup):
        """A process group whose flat all_gather follows NCCL's contract; the rest is gloo's."""

        def __init__(self, store, rank: int, size: int, timeout):
            super().__init__(rank, size)
            self.inner = dist.ProcessGroupGloo(dist.PrefixStore(f"{NAME}/gloo", store), rank, size, timeout)

        def getBackendName(self) -> str:  # noqa: N802 - torch's name for it
            return NAME

        def _get_backend_name(self) -> str:
            return NAME

        def _allgather_base(self, output, input, opts=None):
            views = _flat_views(output, input, self.size())
            args = ([views], [input]) if opts is None else ([views], [input], opts)
            return self.inner.allgather(*args)

        def all_gather_single(self, output, input, opts=None):
            return self._allgather_base(output, input, opts)

        def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
            works = [self._allgather_base(o, i, opts) for o, i in zip(outputs, inputs)]
            for work in works[:-1]:
                work.wait()
            return works[-1]

    for name in DELEGATED:
        setattr(NcclContractGroup, name, _delegate(name))
    return NcclContractGroup


def create(store, rank: int, size: int, timeout):
    """The creator torch calls for every group of this backend (the world and each ``new_group``)."""
    return _group_class()(store, rank, size, timeout)


def register() -> None:
    """Make ``NAME`` a backend ``init_process_group`` and ``new_group`` accept, for CPU tensors."""
    global _registered
    if _registered:
        return
    import torch.distributed as dist

    try:
        dist.Backend.register_backend(NAME, create, devices=["cpu"])
    except TypeError:  # torch < 2.0: no devices argument
        dist.Backend.register_backend(NAME, create)
    _registered = True


# ---- harness/engine/compiled.py, verbatim ----------------------------------


SHOWN = 6  # differing tensors named in a record


def compile_options(case) -> dict:
    """``torch.compile`` keyword arguments of the case (besides the backend)."""
    return {"fullgraph": "fullgraph" in case.compile, "dynamic": True if "dynamic" in case.compile else None}


class Recorder:
    """An adapter in front of ``impl`` that records what its modules produce, optionally compiling them.

    Everything but :meth:`forward` is the wrapped adapter's (attributes are looked up on it), so the
    scenario builds, converts and wraps modules exactly as it would without the recorder.
    """

    def __init__(self, impl, compile_with=None):
        self.__dict__.update(impl=impl, compile_with=compile_with, outputs=[], grads={}, modules=[], compiled={})

    def __getattr__(self, name):
        return getattr(self.impl, name)

    def __setattr__(self, name, value):
        setattr(self.impl, name, value)  # what a scenario sets on its adapter, the adapter keeps

    def forward(self, module, input):
        """Call ``module`` (compiled, when compiling) through the adapter; keep its output and input gradient."""
        if not any(m is module for m in self.modules):
            self.modules.append(module)
        call = module
        if self.compile_with is not None:
            key = id(module)
            if key not in self.compiled:
                self.compiled[key] = torch.compile(module, **self.compile_with)
            call = self.compiled[key]
        output = self.impl.forward(call, input)
        index = len(self.outputs)
        self.outputs.append(output.detach().cpu().clone())
        if input.requires_grad and torch.is_grad_enabled():
            input.register_hook(lambda g: self.grads.__setitem__(index, g.detach().cpu().clone()))
        return output

    def tensors(self) -> dict[str, torch.Tensor]:
        """Everything recorded, by name: ``forward<i>.output``, ``forward<i>.grad_input``, ``state.<module>.<k>``."""
        out = {f"forward{i}.output": y for i, y in enumerate(self.outputs)}
        out.update({f"forward{i}.grad_input": g for i, g in sorted(self.grads.items())})
        for k, m in enumerate(self.modules):
            for name, t in m.state_dict().items():
                if torch.is_tensor(t):
                    out[f"state.{k}.{name}"] = t.detach().cpu().clone()
        return out


def compare_with_eager(eager: dict[str, torch.Tensor], compiled: dict[str, torch.Tensor]) -> dict:
    """Which tensors of the compiled pass differ from the eager pass's, and by how much at most."""
    differs, worst = [], 0.0
    for name in sorted(set(eager) | set(compiled), key=_natural):
        a, b = eager.get(name), compiled.get(name)
        if a is None or b is None:
            differs.append(f"{name} ({'only compiled' if a is None else 'only eager'})")
            continue
        if a.dtype != b.dtype or a.shape != b.shape:
            differs.append(f"{name} ({b.dtype}{list(b.shape)}, eager {a.dtype}{list(a.shape)})")
            continue
        if bits(a) == bits(b):
            continue
        d = float((a.double() - b.double()).abs().nan_to_num(nan=float("inf")).max()) if a.is_floating_point() \
            else float((a.long() - b.long()).abs().max())
        worst = max(worst, d)
        differs.append(f"{name} (by {d:.3g})")
    return {"bitwise": not differs, "compared": len(set(eager) | set(compiled)), "differs": differs[:SHOWN],
            "differing": len(differs), "max_abs_diff": worst}


def _natural(name: str):
    head, _, rest = name.partition(".")
    digits = "".join(c for c in head if c.isdigit())
    return (head.rstrip("0123456789"), int(digits) if digits else -1, rest)


class DynamoLog:
    """What dynamo does from :meth:`start` on in this process: graphs, graph breaks, recompiles."""

    def __init__(self, backend: str):
        self.name, self.graphs, self.ops = backend, 0, 0

    def start(self) -> None:
        """Forget every compiled frame and counter of earlier cases (their cache entries would be reused)."""
        import torch._dynamo

        torch._dynamo.reset()
        from torch._dynamo import utils

        utils.counters.clear()
        for name in ("guard_failures", "graph_break_reasons"):
            getattr(utils, name, {}).clear()

    def backend(self):
        """The named backend, behind a counter of the graphs it is given."""
        import torch._dynamo

        named = torch._dynamo.lookup_backend(self.name)

        def counting(gm, example_inputs):
            self.graphs += 1
            self.ops += sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))
            return named(gm, example_inputs)

        return counting

    def summary(self) -> dict:
        """Graphs, ops in them, graph breaks (reason, where, count), frames dynamo gave up on and ran eagerly
        (reason, count), and recompiles (the guard that failed, count)."""
        from torch._dynamo import utils

        breaks: dict[tuple, int] = {}
        reasons = getattr(utils, "graph_break_reasons", None)
        if reasons is not None:
            for r in reasons:
                key = (short_reason(r.reason), _where(getattr(r, "user_stack", None)))
                breaks[key] = breaks.get(key, 0) + 1
        else:
            for reason, n in utils.counters.get("graph_break", {}).items():
                breaks[(short_reason(reason), "")] = breaks.get((short_reason(reason), ""), 0) + n
        skipped: dict[str, int] = {}
        for reason, n in utils.counters.get("unimplemented", {}).items():
            skipped[short_reason(reason)] = skipped.get(short_reason(reason), 0) + n
        recompiles: dict[str, int] = {}
        for failures in getattr(utils, "guard_failures", {}).values():
            for reason in failures:
                text = short_reason(str(reason).split(": ", 1)[-1])
                recompiles[text] = recompiles.get(text, 0) + 1
        return {"graphs": self.graphs, "ops": self.ops,
                "graph_breaks": [{"reason": k[0], "where": k[1], "count": n} for k, n in breaks.items()],
                "skipped_frames": [{"reason": k, "count": n} for k, n in skipped.items()],
                "recompiles": [{"reason": k, "count": n} for k, n in recompiles.items()]}


CHAINED = "*** While handling this graph break, another graph break occurred: ***"


def short_reason(text: str) -> str:
    """Dynamo's reason in one line: each part's first line and developer context, paths cut to file names.

    Messages that chain several reasons (a break while handling another) keep each, joined by `` -> ``.
    """
    parts = []
    for part in str(text).split(CHAINED):
        lines = [ln.strip() for ln in part.splitlines() if ln.strip()]
        if not lines:
            continue
        first = lines[0]
        context = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Developer debug context:")),
                       "")
        parts.append(f"{first} ({context})" if context and context not in first else first)
    return re.sub(r"(?:/[^\s/()'\"]+)+/([^\s/()'\"]+\.py)", r"\1", " -> ".join(parts) or "unknown")


def _where(stack) -> str:
    if not stack:
        return ""
    frame = stack[-1]
    return f"{Path(frame.filename).name}:{frame.lineno} in {frame.name}"


def run_compiled(scenario, ctx, case, impl, device: str, result, compare_with: Optional[str] = None) -> None:
    """Run ``case`` eagerly, then compiled, with ``scenario``; judge the compiled pass and compare the two."""
    eager = Recorder(impl)
    scenario.run_rank(ctx, case, eager, device, RankResult(rank=ctx.rank))
    backend = case.compile[0]
    impl.before_compile()
    log = DynamoLog(backend)
    log.start()
    compiled = Recorder(impl, compile_with={"backend": log.backend(), **compile_options(case)})
    try:
        with suspended():
            scenario.run_rank(ctx, case, compiled, device, result, compare_with)
    finally:
        result.compile = {"backend": backend, **compile_options(case), **log.summary()}
    versus = compare_with_eager(eager.tensors(), compiled.tensors())
    result.compile["vs_eager"] = versus
    if backend == "eager" and not versus["bitwise"]:
        result.metrics["compile.vs_eager"] = Metric.failure(
            f"backend eager differs from eager in {versus['differing']} of {versus['compared']} tensors: "
            + ", ".join(versus["differs"][:3]))


# ---- harness/scenarios/layer.py, verbatim ----------------------------------


TENSORS = ("output", "grad_input", "grad_weight", "grad_bias", "running_mean", "running_var")


BUFFERS = ("running_mean", "running_var", "num_batches_tracked")


def run_rank(ctx, case: Case, impl, device: str, result, compare_with: Optional[str] = None) -> None:
    """Run ``case`` with ``impl`` on this rank and fill ``result`` (metrics, what the parent judges across ranks)."""
    rank = ctx.rank
    torch.manual_seed(case.seed)
    data = materialize(case)
    truths = run_oracle(
        data.inputs, data.grad_outputs, case.steps, num_features=case.channels, eps=case.eps,
        momentum=case.momentum, affine=case.affine, track_running_stats=case.track_running_stats,
        weight=data.weight, bias=data.bias, param_dtype=DTYPES[case.param_dtype],
        running_mean=data.running_mean, running_var=data.running_var, groups=case.groups, ranks=[rank])
    group = ctx.process_group(case)
    observed, convert_problems = run_steps(case, impl, device, rank, data, group)
    result.across["buffers"] = {str(s): {name: obs[f"{name}_bits"] for name in BUFFERS}
                                for s, obs in enumerate(observed) if obs is not None}
    if case.affine:
        judged = {s: obs.get("grad_steps") or [s] for s, obs in enumerate(observed)
                  if obs is not None and obs.get("grads", "own") in ("own", "accumulated")}
        result.across["shares"] = {str(s): {which: _as_list(observed[s][which], case.channels)
                                            for which in ("grad_weight", "grad_bias")} for s in judged}
        if rank == 0:
            result.across["sum_truth"] = {
                str(s): {which: {"true": sum(getattr(truths[i], f"{which}_sum") for i in steps).tolist(),
                                 "tol": sum(sum_tolerance(case, data, truths, i, which) for i in steps).tolist()}
                         for which in ("grad_weight", "grad_bias")}
                for s, steps in judged.items()}
    if compare_with:
        result.compare = compare_implementations(ctx, case, compare_with, device, data, group, observed)
    metrics = judge_rank(case, rank, data, truths, observed)
    metrics += [(f"convert.{i}", Metric.failure(p)) for i, p in enumerate(convert_problems)]
    for s, obs in enumerate(observed):
        if obs is None:
            continue
        tag = f"step{s}.{STEP_KINDS[case.steps[s]]}"
        metrics += [(f"{tag}.input", Metric.failure(p)) for p in obs["input_problems"]]
    result.metrics = dict(metrics)


def judge_across(case: Case, results: list) -> list[tuple[str, Metric]]:
    """The grad shares' sums against the oracle's, and the buffers that must be bitwise equal on every rank."""
    out = []
    groups = [list(g) for g in (case.groups or [tuple(range(case.world_size))])]
    buffers = {r.rank: r.across.get("buffers", {}) for r in results}
    steps = sorted({s for b in buffers.values() for s in b}, key=int)
    for s in steps:
        for name in BUFFERS:
            per_rank = {r: b[s][name] for r, b in buffers.items() if s in b}
            kind = STEP_KINDS[case.steps[int(s)]]
            bad = compare_across(f"step{s}.{kind}.{name}", per_rank, groups)
            if bad is not None:
                out.append((f"step{s}.{kind}.{name}.across_ranks", bad))
    if not case.affine or len(results) != case.world_size:
        return out
    sum_truth = next((r.across.get("sum_truth") for r in results if r.across.get("sum_truth")), None)
    if sum_truth and all("shares" in r.across for r in results):
        out += judge_sums(sum_truth, [r.across["shares"] for r in results])
    return out


def present(x: torch.Tensor, layout: str, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(the input as the implementation gets it, the leaf tensor its gradient lands in).

    ``dense``: a copy in the case's memory format. ``permuted``: a view whose first and last dimensions are
    swapped in memory (dense, but in no memory format). ``sliced``: every other sample of a twice-as-large
    tensor (a strided view, not dense).
    """
    x = x.to(device)
    if layout == "permuted":
        base = x.transpose(0, -1).contiguous().detach().requires_grad_(True)
        return base.transpose(0, -1), base
    if layout == "sliced":
        base = torch.zeros((2 * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
        base[::2] = x
        base.requires_grad_(True)
        return base[::2], base
    leaf = x.detach().clone().requires_grad_(True)
    return leaf, leaf


def _grad_of(view: torch.Tensor, leaf: torch.Tensor, layout: str) -> Optional[torch.Tensor]:
    """The gradient that reached the input view, from its leaf's."""
    if leaf.grad is None:
        return None
    if layout == "permuted":
        return leaf.grad.transpose(0, -1)
    if layout == "sliced":
        return leaf.grad[::2]
    return leaf.grad


def _input_problems(x: torch.Tensor, before: torch.Tensor, y: torch.Tensor) -> list[str]:
    problems = []
    if not torch.equal(x.detach(), before) and not (x.isnan().any() and before.isnan().any()):
        problems.append("forward changed its input (the input tensor must be left as it was)")
    if y.numel() and x.numel() and y.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
        problems.append("the output aliases the input's memory (a later write to one changes the other)")
    return problems


def run_steps(case: Case, impl, device: str, rank: int, data, group) -> tuple[list, list[str]]:
    """Build this rank's module (or convert the nested model), run every step, return what it produced.

    ``observed[s]`` is None for a step this rank takes no part in.
    """
    pdtype = DTYPES[case.param_dtype]
    convert_problems: list[str] = []
    if case.model == "nested":
        module, convert_problems = convert_nested(case, impl, group)
    else:
        module = impl.build(case, group, device)
    module = module.to(device=device, dtype=pdtype)
    with torch.no_grad():
        if case.affine:
            module.weight.copy_(data.weight)
            module.bias.copy_(data.bias)
        if case.track_running_stats:
            module.running_mean.copy_(data.running_mean)
            module.running_var.copy_(data.running_var)
    observed: list = []
    pending: list = []  # forwards ("fwd" steps) whose backward comes with the next train step
    for s, kind in enumerate(case.steps):
        mark_step(s)
        if kind == "eval-rank0" and rank != 0:
            observed.append(None)
            continue
        module.train(STEP_KINDS[kind] == "train")
        x, leaf = present(data.inputs[s][rank], case.input_layout, device)
        before = x.detach().clone()
        dy = data.grad_outputs[s][rank].to(device)
        guard = forbid_collectives("evaluation on rank 0 alone") if kind == "eval-rank0" else contextlib.nullcontext()
        with guard:
            if kind == "nograd":
                with torch.no_grad():
                    y = impl.forward(module, x)
            else:
                y = impl.forward(module, x)
            if kind not in ("nograd", "fwd"):
                torch.autograd.backward([y] + [p[2] for p in pending], [dy] + [p[3] for p in pending])
        obs = {"output": y.detach().cpu().clone(), "input_problems": _input_problems(x, before, y),
               "layout_checked": case.input_layout == "dense",
               "grads": {"nograd": "none", "fwd": "deferred"}.get(kind, "accumulated" if pending else "own")}
        if kind == "fwd":
            pending.append((s, (x, leaf), y, dy))
        else:
            for ps, (px, pleaf), _, _ in pending:
                observed[ps]["grad_input"] = _cpu(_grad_of(px, pleaf, case.input_layout))
            obs["grad_steps"] = [p[0] for p in pending] + [s]
            pending = []
        obs["grad_input"] = _cpu(_grad_of(x, leaf, case.input_layout))
        obs["grad_weight"] = _cpu(getattr(module.weight, "grad", None)) if case.affine else None
        obs["grad_bias"] = _cpu(getattr(module.bias, "grad", None)) if case.affine else None
        for name in ("running_mean", "running_var"):
            obs[name] = _cpu(getattr(module, name)) if case.track_running_stats else None
        obs["num_batches_tracked"] = int(module.num_batches_tracked) if case.track_running_stats else None
        for name in BUFFERS:
            obs[f"{name}_bits"] = bits(getattr(module, name, None)) if case.track_running_stats else None
        observed.append(obs)
        if kind != "fwd":
            module.zero_grad(set_to_none=True)
    mark_step(None)
    return observed, convert_problems


def compare_implementations(ctx, case: Case, other_name: str, device: str, data, group, observed) -> dict:
    """Run another implementation on the same inputs on this rank; the largest difference per tensor and step."""
    other = ctx.impl(other_name, device)
    out: dict = {"with": other.name, "max_abs_diff": {}, "error": None}
    reason = other.unsupported_reason(case, device)
    if reason:
        out["error"] = f"unsupported: {reason}"
        return out
    theirs, _ = run_steps(case, other, device, ctx.rank, data, group)
    for s, (a, b) in enumerate(zip(observed, theirs)):
        if a is None or b is None:
            continue
        for name in TENSORS:
            ta, tb = a[name], b[name]
            if ta is None or tb is None or ta.shape != tb.shape:
                continue
            diff = (ta.double() - tb.double()).abs()
            out["max_abs_diff"][f"step{s}.{case.steps[s]}.{name}"] = float(diff.max()) if diff.numel() else 0.0
    return out


BATCHNORM_BY_NDIM = {2: "BatchNorm1d", 3: "BatchNorm1d", 4: "BatchNorm2d", 5: "BatchNorm3d"}


def convert_nested(case: Case, impl, group):
    """Build a nested model of plain BatchNorms, convert it with the implementation, check what it kept.

    The model: ``layer`` (the case's configuration, the one then run through the
    steps), ``block.inner`` (nested one level down, beside a ReLU) and ``frozen``
    (weight not requiring grad, in eval mode). Returns the converted ``layer``
    and a list of problems (parameters, buffers, requires_grad, training flags,
    process group, modules left unconverted).
    """
    nn = torch.nn
    bn = getattr(nn, BATCHNORM_BY_NDIM[case.ndim])
    pdtype = DTYPES[case.param_dtype]
    gen = torch.Generator().manual_seed(case.seed + 1)
    layer = bn(case.channels, eps=case.eps, momentum=case.momentum, affine=case.affine,
               track_running_stats=case.track_running_stats)
    inner, frozen = bn(case.channels), bn(case.channels)
    with torch.no_grad():
        for m in (inner, frozen):
            m.weight.copy_(torch.rand(case.channels, generator=gen) + 0.5)
            m.bias.copy_(torch.randn(case.channels, generator=gen))
            m.running_mean.copy_(torch.randn(case.channels, generator=gen))
            m.num_batches_tracked.fill_(3)
    frozen.weight.requires_grad_(False)
    frozen.eval()
    model = nn.Sequential(OrderedDict(layer=layer, block=nn.Sequential(OrderedDict(inner=inner, act=nn.ReLU())),
                                      frozen=frozen)).to(pdtype)
    params = {n: (p.detach().clone(), p.requires_grad) for n, p in model.named_parameters()}
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    training = {n: m.training for n, m in model.named_modules()}
    converted = impl.convert(model, group)
    problems = []
    for name in ("layer", "block.inner", "frozen"):
        m = converted.get_submodule(name)
        if type(m) is bn:
            problems.append(f"{name} is still {bn.__name__}: not converted")
        if group is not None and hasattr(m, "process_group") and m.process_group is not group:
            problems.append(f"{name} lost the process group")
    if not isinstance(converted.get_submodule("block.act"), nn.ReLU):
        problems.append("block.act is no longer the ReLU")
    got_params = dict(converted.named_parameters())
    for n, (value, requires_grad) in params.items():
        if n not in got_params:
            problems.append(f"parameter {n} missing after conversion")
            continue
        if not torch.equal(got_params[n].detach().cpu(), value):
            problems.append(f"parameter {n} changed value")
        if got_params[n].requires_grad != requires_grad:
            problems.append(f"parameter {n}: requires_grad {got_params[n].requires_grad}, was {requires_grad}")
    got_buffers = dict(converted.named_buffers())
    for n, value in buffers.items():
        if n not in got_buffers or not torch.equal(got_buffers[n].detach().cpu(), value):
            problems.append(f"buffer {n} missing or changed")
    modules = dict(converted.named_modules())
    for n, flag in training.items():
        if n and n in modules and modules[n].training != flag:
            problems.append(f"module {n}: training {not flag}, was {flag}")
    return converted.get_submodule("layer"), problems


def _cpu(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.detach().cpu().clone()


def _as_list(t: Optional[torch.Tensor], n: int) -> list:
    if t is None:
        return [0.0] * n
    return [float(v) for v in t.double().reshape(-1)]


# ---- harness/engine/rank.py: RankContext, run_task and what they use, verbatim 


class RankContext:
    """Per-process state kept between tasks: adapters already set up, subgroups already made."""

    def __init__(self, rank: int, world_size: int):
        self.rank = rank
        self.world_size = world_size
        self._impls: dict = {}
        self._groups: dict[tuple, list] = {}

    def impl(self, key: str, device: str):
        """The adapter named ``key``, set up for this process once."""
        if key not in self._impls:
            impl = resolve(key)
            impl.setup_rank(device)
            self._impls[key] = impl
        return self._impls[key]

    def process_group(self, case):
        """The process group of this rank for ``case`` (None: the default group)."""
        if not case.groups:
            return None
        import torch.distributed as dist

        key = tuple(tuple(g) for g in case.groups)
        if key not in self._groups:
            # new_group is collective over the whole world: every rank creates every group, in order.
            self._groups[key] = [dist.new_group(list(g)) for g in key]
        for ranks, pg in zip(key, self._groups[key]):
            if self.rank in ranks:
                return pg
        raise ValueError(f"rank {self.rank} is in no group of {key}")


def scenario_module(case):
    """The module that runs ``case`` on a rank (see :mod:`harness.scenarios`)."""
    return scenario_named(case.scenario)


def run_task(ctx: RankContext, task: Task, scenario=None) -> RankResult:
    """Run one (case, impl) on this rank and judge it; never raises (an exception becomes an ``error``).

    ``scenario``: the module that runs the case (default: the one the case names).
    """
    t0 = time.perf_counter()
    result = RankResult(rank=ctx.rank)
    begin_task()
    try:
        case = Case.from_dict(task.case)
        impl = ctx.impl(task.impl, task.device)
        result.impl_version = impl.version()
        result.mode = impl.mode
        try:
            runner = scenario or scenario_module(case)
            if case.compile:
                compiled.run_compiled(runner, ctx, case, impl, task.device, result, task.compare)
            else:
                runner.run_rank(ctx, case, impl, task.device, result, task.compare)
        finally:
            result.collectives = recorded()
        # What the rank said goes first: a wrong collective is the cause of the wrong tensors after it.
        said = eval_checks(case, result.collectives) + group_checks(case, ctx.rank, result.collectives)
        result.metrics = dict(said + [(k, m) for k, m in result.metrics.items() if k not in dict(said)])
        bad = [(name, m) for name, m in result.metrics.items() if not m.ok]
        result.status = RankStatus.MISMATCH if bad else RankStatus.PASS
        result.message = "; ".join(f"{name}: {m.describe()}" for name, m in bad[:4]) + (
            f" (+{len(bad) - 4} more)" if len(bad) > 4 else "")
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - a rank reports every failure as data
        result.status = RankStatus.ERROR
        result.exception_type = type(exc).__name__
        result.message = str(exc)[:2000]
        result.traceback = traceback.format_exc()[-8000:]
    result.duration_s = time.perf_counter() - t0
    return result


# ---- harness/impls/base.py: construct_like_syncbn and what they use, verbatim 


def construct_like_syncbn(factory, case: Case, process_group):
    """One module from a class or factory with ``torch.nn.SyncBatchNorm``'s constructor, for ``case``.

    The signature: ``(num_features, eps=1e-5, momentum=0.1, affine=True,
    track_running_stats=True, process_group=None)``, keywords after the first.
    """
    return factory(case.channels, eps=case.eps, momentum=case.momentum, affine=case.affine,
                   track_running_stats=case.track_running_stats, process_group=process_group)


# ---- harness/impls/apex.py: construct_apex, convert_apex, apex_forward and what they use, verbatim 


def construct_apex(cls, case: Case, process_group):
    """apex's SyncBatchNorm for ``case``: positional, as apex's own ``convert_syncbn_model`` calls it
    (the fallback and the optimized class share this prefix of their signatures)."""
    return cls(case.channels, case.eps, case.momentum, case.affine, case.track_running_stats, process_group)


def convert_apex(model, process_group):
    """``apex.parallel.convert_syncbn_model`` with the process group."""
    from apex.parallel import convert_syncbn_model

    return convert_syncbn_model(model, process_group=process_group)


def apex_forward(module, input):
    """Call an apex SyncBatchNorm as a user with this input would.

    The optimized class (it has ``channel_last``) with channels-last input
    (NCHW shape, NHWC memory) gets its NHWC view (a permute, no copy) with
    ``channel_last=True``, and the output is viewed back; any other input goes
    in as it is, with ``channel_last=False``. The Python fallback and 2-D input
    (which apex treats as channel-last itself) are called plainly.
    """
    import torch

    if getattr(module, "channel_last", None) is None or input.dim() <= 2:
        return module(input)
    fmt = torch.channels_last if input.dim() == 4 else torch.channels_last_3d
    nhwc = input.dim() in (4, 5) and input.is_contiguous(memory_format=fmt) and not input.is_contiguous()
    module._specify_channel_last(nhwc)
    if not nhwc:
        return module(input)
    to_last = (0, *range(2, input.dim()), 1)
    back = (0, input.dim() - 1, *range(1, input.dim() - 1))
    return module(input.permute(to_last)).permute(back)


# ---- harness/repro/standalone.py, verbatim ---------------------------------


CASE: Case = None  # type: ignore[assignment]


IMPL_NAME = ""


KIND = "plugin"  # plugin | torch | apex | reference: how the implementation is loaded


DEVICE = "cpu"


BACKEND = "gloo"


TIMEOUT_S = 300.0  # the whole case, every rank; then the ranks are killed and it is a hang


PLUGIN_MODULE = None


PLUGIN_ATTR = None


FOUND_IN = None  # where the plugin module was found when the file was written (a fallback on sys.path)


EMBEDDED = False  # True in a written file: the scenario's functions are this module's own


def scenario():
    """The module with the case's ``run_rank``/``judge_across``: this file itself once written."""
    if EMBEDDED:
        return sys.modules[__name__]
    return importlib.import_module(f"harness.scenarios.{CASE.scenario}")


def load_factory():
    """The implementation's class or factory, loaded as the harness loads it."""
    if KIND == "torch":
        return torch.nn.SyncBatchNorm
    if KIND == "apex":
        from apex.parallel import SyncBatchNorm

        return SyncBatchNorm
    if KIND == "reference":  # not standalone: the harness's own SyncBN needs the harness and its C++ kernels
        importlib.import_module("harness.kernels.extension").load()
        return importlib.import_module("harness.impls.reference").SyncBatchNorm
    try:
        mod = importlib.import_module(PLUGIN_MODULE)
    except ImportError:
        if not (FOUND_IN and os.path.isdir(FOUND_IN)):
            raise
        print(f"repro: {PLUGIN_MODULE} is not importable; using {FOUND_IN} (where it was found)", file=sys.stderr)
        sys.path.insert(0, FOUND_IN)
        mod = importlib.import_module(PLUGIN_MODULE)
    return getattr(mod, PLUGIN_ATTR)


class ReproImpl:
    """The implementation under test, in the shape the scenario's rank code expects of an adapter."""

    mode = "native"

    @property
    def name(self) -> str:
        return IMPL_NAME

    def version(self):
        mod = sys.modules.get(PLUGIN_MODULE) if PLUGIN_MODULE else None
        return getattr(mod, "__version__", None) if mod else torch.__version__

    def build(self, case, process_group, device):
        if KIND == "apex":
            return construct_apex(load_factory(), case, process_group)
        return construct_like_syncbn(load_factory(), case, process_group)

    def convert(self, model, process_group):
        if KIND == "apex":
            return convert_apex(model, process_group)
        return load_factory().convert_sync_batchnorm(model, process_group)

    def forward(self, module, input):
        if KIND == "apex":
            return apex_forward(module, input)
        return module(input)

    ddp_note = None

    def ddp_guard(self):
        """DistributedDataParallel wraps the model as it does for any user (nothing to get past here)."""
        return contextlib.nullcontext()

    def before_compile(self):
        """Nothing of this file's adapter runs from the dispatcher, so nothing to hide from dynamo."""


class ReproContext(RankContext):
    """A rank's context whose only implementation is the one under test."""

    def impl(self, key, device):
        return ReproImpl()


def one_rank(rank: int, world_size: int) -> RankResult:
    install_recorder()
    if DEVICE == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    task = Task(case=CASE.to_dict(), impl=IMPL_NAME, device=DEVICE)
    return run_task(ReproContext(rank, world_size), task, scenario=scenario())


def _rank_entry(rank: int, world_size: int, port: int, outdir: str) -> None:
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=TIMEOUT_S)
    store = dist.TCPStore("127.0.0.1", port, world_size + 1, False, timeout=timeout)
    if BACKEND == NAME:
        register()
    dist.init_process_group(BACKEND, store=store, rank=rank, world_size=world_size, timeout=timeout)
    try:
        result = one_rank(rank, world_size)
    finally:
        dist.destroy_process_group()
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(result.to_dict(), f)


def spawn_ranks() -> tuple[list[RankResult], list[str]]:
    """One process per rank (spawn), a TCPStore on a port the OS picks; every wait bounded."""
    import multiprocessing as mp

    import torch.distributed as dist

    ws = CASE.world_size
    timeout = datetime.timedelta(seconds=TIMEOUT_S)
    try:
        store = dist.TCPStore("127.0.0.1", 0, ws + 1, True, wait_for_workers=False, timeout=timeout)
    except TypeError:  # releases without wait_for_workers
        store = dist.TCPStore("127.0.0.1", 0, ws + 1, True, timeout=timeout)
    outdir = tempfile.mkdtemp(prefix="syncbn-repro-")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_entry, args=(r, ws, store.port, outdir), daemon=True) for r in range(ws)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + TIMEOUT_S + 60
    problems = []
    for r, p in enumerate(procs):
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            problems.append(f"rank {r}: hang (still running after {TIMEOUT_S}s)")
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join(10)
    results = []
    for r, p in enumerate(procs):
        path = os.path.join(outdir, f"rank{r}.json")
        if os.path.exists(path):
            with open(path) as f:
                results.append(RankResult.from_dict(json.load(f)))
        elif not any(s.startswith(f"rank {r}:") for s in problems):
            problems.append(f"rank {r}: crash (exit code {p.exitcode}, no result)")
    return results, problems


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def torchrun_rank() -> tuple[list[RankResult], int]:
    import torch.distributed as dist

    ws = int(os.environ["WORLD_SIZE"])
    if ws != CASE.world_size:
        print(f"repro: this case needs {CASE.world_size} ranks, torchrun started {ws}: "
              f"use --nproc-per-node={CASE.world_size}", file=sys.stderr)
        sys.exit(2)
    if DEVICE == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if BACKEND == NAME:
        register()
    dist.init_process_group(BACKEND, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    rank = dist.get_rank()
    result = one_rank(rank, ws)
    everyone = [None] * ws
    dist.all_gather_object(everyone, result.to_dict())
    dist.destroy_process_group()
    return [RankResult.from_dict(d) for d in everyone], rank


def disagreements(results: list[RankResult], problems: list[str]) -> list[str]:
    """Every way the ranks' results disagree with the oracle, one line each (empty: they agree)."""
    lines = list(problems)
    for res in sorted(results, key=lambda r: r.rank):
        if res.status is RankStatus.ERROR:
            lines.append(f"rank {res.rank}: error {res.exception_type}: {res.message}")
            lines.append(res.traceback or "")
        for name, m in res.metrics.items():
            if not m.ok:
                lines.append(f"rank {res.rank}: {name}: " + (m.problem or (
                    f"max abs err {m.max_abs_err!r} > tol {m.tol!r} ({m.ratio:.4g}x the tolerance), "
                    f"max rel err {m.max_rel_err!r}")))
    if len(results) == CASE.world_size and all(r.status is not RankStatus.ERROR for r in results):
        lines += [f"{name}: {m.describe()}" for name, m in scenario().judge_across(CASE, results) if not m.ok]
    return lines


def verdict(results: list[RankResult], problems: list[str], show: bool = True) -> int:
    """Print (if ``show``) what disagrees with the oracle; 0 when nothing does, 1 otherwise."""
    lines = disagreements(results, problems)
    if not show:
        return 1 if lines else 0
    build = f"torch {torch.__version__} (git {torch.version.git_version}), {DEVICE}/{BACKEND}"
    if lines:
        print(f"FAIL: {IMPL_NAME} disagrees with the float64 oracle on {CASE.id} ({build}):")
        for line in lines:
            print("  " + line)
        return 1
    print(f"PASS: {IMPL_NAME} agrees with the float64 oracle on {CASE.id} ({build})")
    return 0


def main() -> int:
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("repro: this reproduction runs on CUDA and no GPU is visible here", file=sys.stderr)
        return 2
    if DEVICE == "cuda" and torch.cuda.device_count() < CASE.world_size and not under_torchrun():
        print(f"repro: {CASE.world_size} ranks need {CASE.world_size} GPUs, {torch.cuda.device_count()} visible; "
              "nccl cannot share one GPU between ranks", file=sys.stderr)
        return 2
    if under_torchrun():
        results, rank = torchrun_rank()
        return verdict(results, [], show=rank == 0)  # every rank exits with the verdict; rank 0 prints it
    results, problems = spawn_ranks()
    return verdict(results, problems)


# ---- this reproduction ----------------------------------------------------------
CASE = Case.from_dict(json.loads('{"id": "search/float32-float32/contiguous/empty-0-2/c1x1x1/momentum-none/train/ws2-907e69f4", "family": "search", "batch_sizes": [0, 2], "spatial": [[1, 1], [1, 1]], "channels": 1, "dtype": "float32", "param_dtype": "float32", "memory_format": "contiguous", "grad_memory_format": null, "affine": true, "track_running_stats": true, "momentum": null, "eps": 1e-05, "steps": ["train"], "groups": null, "input_mean": 0.0, "input_scale": 1.0, "constant_channels": [], "model": null, "scenario": "layer", "step_batch_sizes": null, "input_layout": "dense", "optimizer": null, "ddp": [], "checkpoint": null, "backend": null, "compile": [], "seed": 0, "default": false, "note": ""}'))
IMPL_NAME = 'fairscale.experimental.nn:SyncBatchNorm'
KIND = 'plugin'
DEVICE = 'cpu'
BACKEND = 'gloo'
TIMEOUT_S = 300.0
PLUGIN_MODULE = 'fairscale.experimental.nn'
PLUGIN_ATTR = 'SyncBatchNorm'
FOUND_IN = '/work/main/.venv/lib/python3.11/site-packages'
EMBEDDED = True


if __name__ == "__main__":
    sys.exit(main())
