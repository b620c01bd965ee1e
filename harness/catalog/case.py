"""A case: plain data that says what to run, and the tensors it stands for.

A :class:`Case` is frozen plain data (numbers, strings, tuples) that crosses
process boundaries as a dict (``to_dict``/``from_dict``). Its tensors are not
stored: :func:`materialize` regenerates them from ``seed``, identically in
every process, on CPU, and rounds them to the case's dtypes. The oracle and
every rank therefore see the same inputs without sending them anywhere.

Per step and rank, the input has shape ``(batch_sizes[r], channels,
*spatial[r])`` (``step_batch_sizes[s][r]`` when the batch size changes between
steps) and the upstream gradient the same shape. The gradient is laid out in
``grad_memory_format`` (default: the input's), so cases can hand an
implementation a gradient whose layout differs from its input's.

Steps (:data:`STEP_KINDS`): ``train`` (forward, backward), ``eval``
(forward, backward with the running statistics), ``fwd`` (a training forward
whose backward comes with the next ``train`` step: two forwards, one backward
of the sum), ``nograd`` (a training forward under ``torch.no_grad()``),
``eval-rank0`` (rank 0 alone evaluates while the others wait, as validation on
one rank does), ``eval-subset`` (every rank but the last evaluates, the last
waits: validation on a subset of ranks). No collective may be issued in
either (:func:`evaluates`).
"""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass, field, fields
from typing import Optional, Sequence

import torch

from harness.slices import batch_slices

# Step kind -> what the normalization does in it: "train" (batch statistics, synchronized) or "eval".
STEP_KINDS = {"train": "train", "fwd": "train", "nograd": "train", "eval": "eval", "eval-rank0": "eval",
              "eval-subset": "eval"}
INPUT_LAYOUTS = ("dense", "permuted", "sliced")
CASE_BACKENDS = (None, "nccl-contract")  # None: the run's backend
# The conversion family's user models (harness.scenarios.user_models) and checkpoint round trips
# (harness.scenarios.checkpoint): named here, so the catalog need not import the scenarios.
CONVERSION_MODELS = ("bn-act", "lazy", "frozen", "config", "no-running-stats", "nested")
CHECKPOINT_MODES = ("resume-2-3", "resume-3-2", "revert", "rank0-ddp")
# Model scenarios: how the network is trained beyond its DDP flags. "frozen-norm": every normalization's affine
# parameters do not require grad (their statistics still train, as a norm config with requires_grad=False
# does); "data-input": the network's input does not require grad (data, as users feed it; no input gradient
# is judged).
MODEL_OPTIONS = ("frozen-norm", "data-input")
# What users do around a network holding SyncBN (model scenario; harness.scenarios.uses explains each).
USES = ("checkpoint-layer", "checkpoint-layer-reentrant", "checkpoint-block", "checkpoint-block-reentrant",
        "double-backward", "autocast", "script", "join")
# torch.compile of the case's module: a backend, then optionally "fullgraph" and "dynamic" (dynamic=True)
COMPILE_BACKENDS = ("eager", "aot_eager", "inductor")
COMPILE_OPTIONS = ("fullgraph", "dynamic")

DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}
# The dtypes a case's standard normals may be drawn in. torch draws float64 normals on CPU one value at a time
# and float32 ones vectorized, about five times faster: search, whose cases are new, draws in float32; the
# catalog's cases keep float64, since changing a case's draws would change its data under its stored records.
NORMALS = {"float64": torch.float64, "float32": torch.float32}
# Where each rank's samples come from. "sequential": one generator, seeded with the case's seed, draws the
# parameters and then every step's ranks in order, so a rank's data depends on every rank before it (the
# catalog's cases). "per-rank": the parameters from that generator, each rank's samples from a generator of its
# own (:func:`rank_seed`), so a rank makes its own part alone (search's cases; see harness.engine.exchange).
DRAWS = ("sequential", "per-rank")
MEMORY_FORMATS = {
    "contiguous": torch.contiguous_format,
    "channels_last": torch.channels_last,
    "channels_last_3d": torch.channels_last_3d,
}


def evaluates(kind: str, rank: int, world_size: int) -> bool:
    """Whether ``rank`` takes part in a step of ``kind``: every rank, but rank 0 alone in ``eval-rank0`` and every
    rank but the last in ``eval-subset``."""
    if kind == "eval-rank0":
        return rank == 0
    if kind == "eval-subset":
        return rank < world_size - 1
    return True


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
    # Model scenarios: what the user does around the network (USES: checkpointing, a gradient penalty, autocast,
    # TorchScript, DDP's join), see harness.scenarios.uses.
    use: Optional[str] = None
    options: tuple[str, ...] = ()  # model scenarios: MODEL_OPTIONS
    # Seconds the case may take before it is a hang, where shorter than the run's --timeout: for cases whose
    # expected failure is a hang (DDP's join), so that it costs seconds, not the run's minutes.
    time_limit: Optional[float] = None
    seed: int = -1  # -1: derived from the id, so a case's data never changes with catalog order
    # The dtype the standard normals behind every input and upstream gradient are drawn in (see materialize):
    # "float64" for the catalog's cases, whose data never changes; "float32" for cases search generates.
    normals: str = "float64"
    draws: str = "sequential"  # see DRAWS
    # A case drawn per rank: each rank's generator seed, where not rank_seed(seed, rank) (a rank removed by
    # search's shrinking leaves the others' seeds, and so their data, as they were).
    rank_seeds: tuple[int, ...] = ()
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
        if any(o not in MODEL_OPTIONS for o in self.options):
            raise ValueError(f"case {self.id}: options are among {', '.join(MODEL_OPTIONS)}, got {self.options}")
        if self.normals not in NORMALS:
            raise ValueError(f"case {self.id}: normals must be one of {', '.join(NORMALS)}, got {self.normals!r}")
        if self.draws not in DRAWS:
            raise ValueError(f"case {self.id}: draws must be one of {', '.join(DRAWS)}, got {self.draws!r}")
        if self.rank_seeds and (self.draws != "per-rank" or len(self.rank_seeds) != self.world_size):
            raise ValueError(f"case {self.id}: rank_seeds needs draws='per-rank' and one seed per rank, got "
                             f"{list(self.rank_seeds)} for {self.world_size} ranks drawn {self.draws}")
        if self.use is not None and self.use not in USES:
            raise ValueError(f"case {self.id}: use must be one of {', '.join(USES)}, got {self.use!r}")
        if self.seed < 0:
            object.__setattr__(self, "seed", seed_of(self.id))

    def seeds_of_ranks(self) -> tuple[int, ...]:
        """A case drawn per rank: each rank's generator seed (``rank_seeds``, or derived from ``seed``)."""
        return self.rank_seeds or tuple(rank_seed(self.seed, r) for r in range(self.world_size))

    def on_backend(self, backend: str, *, default: Optional[bool] = None) -> "Case":
        """This case over ``backend`` instead of the run's: the id gets ``/<backend>``, the data stays the same."""
        from dataclasses import replace

        return replace(self, id=f"{self.id}/{backend}", backend=backend, seed=self.seed,
                       default=self.default if default is None else default)

    def timeout(self, run_timeout: float) -> float:
        """Seconds before this case is a hang in a run whose ``--timeout`` is ``run_timeout``."""
        return min(run_timeout, self.time_limit) if self.time_limit else run_timeout

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
            "normals": self.normals,
            "draws": self.draws,
            "rank_seeds": list(self.rank_seeds) or None,
            "model": self.model,
            "scenario": self.scenario,
            "step_batch_sizes": [list(b) for b in self.step_batch_sizes] if self.step_batch_sizes else None,
            "input_layout": self.input_layout,
            "optimizer": self.optimizer,
            "ddp": list(self.ddp),
            "backend": self.backend,
            "compile": list(self.compile),
            "use": self.use,
            "options": list(self.options),
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
        for key in ("batch_sizes", "steps", "constant_channels", "ddp", "compile", "options", "rank_seeds"):
            if key in kw:
                kw[key] = tuple(kw[key] or ())
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

    inputs: list[list[Optional[torch.Tensor]]]  # [step][rank]; None for a rank not made (materialize's ranks)
    grad_outputs: list[list[Optional[torch.Tensor]]]
    weight: torch.Tensor
    bias: torch.Tensor
    running_mean: torch.Tensor
    running_var: torch.Tensor
    extra: dict = field(default_factory=dict)


def rank_seed(seed: int, rank: int) -> int:
    """The seed of rank ``rank``'s own generator in a case whose samples are drawn per rank."""
    return seed * 65537 + rank + 1


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
    running_mean = (torch.randn(C, generator=gen, dtype=torch.float64) * 0.1).to(pdtype)
    running_var = (torch.rand(C, generator=gen, dtype=torch.float64) * 0.5 + 0.75).to(pdtype)
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
