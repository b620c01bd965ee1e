"""A case: plain data that says what to run, and the tensors it stands for.

A :class:`Case` is frozen plain data (numbers, strings, tuples) that crosses
process boundaries as a dict (``to_dict``/``from_dict``). Its tensors are not
stored: :func:`harness.catalog.data.materialize` regenerates them from
``seed``, identically in every process, on CPU, and rounds them to the case's
dtypes. The oracle and every rank therefore see the same inputs without
sending them anywhere. This module names dtypes and layouts by their strings
and never imports torch.

Per step and rank, the input has shape ``(batch_sizes[r], channels,
*spatial[r])`` (``step_batch_sizes[s][r]`` when the batch size changes between
steps) and the upstream gradient the same shape. The gradient is laid out in
``grad_memory_format`` (default: the input's), so cases can hand an
implementation a gradient whose layout differs from its input's, and drawn as
``grad_scale * (grad_mean + N(0, 1))`` (default: plain normals), so cases can
hand it the scaled gradients of a loss scaler.

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
from dataclasses import asdict, dataclass, fields
from typing import Optional

from harness.catalog.dtypes import DTYPE_NAMES

# Step kind -> what the normalization does in it: "train" (batch statistics, synchronized) or "eval".
STEP_KINDS = {"train": "train", "fwd": "train", "nograd": "train", "eval": "eval", "eval-rank0": "eval",
              "eval-subset": "eval"}
TRAINING_KINDS = tuple(k for k, mode in STEP_KINDS.items() if mode == "train")  # the step kinds that train
INPUT_LAYOUTS = ("dense", "permuted", "sliced")
# A case's own process-group backend (None: the run's). "no-group": no process group at all, the rank process never
# initializes torch.distributed (a single process, as users test, debug or infer; world size 1).
NO_GROUP = "no-group"
CASE_BACKENDS = (None, "nccl-contract", "list-contract", NO_GROUP)
# The conversion family's user models (harness.scenarios.user_models) and checkpoint round trips
# (harness.scenarios.checkpoint): named here, so the catalog need not import the scenarios.
CONVERSION_MODELS = ("bn-act", "lazy", "frozen", "config", "no-running-stats", "nested")
CHECKPOINT_MODES = ("resume-2-3", "resume-3-2", "revert", "rank0-ddp")
# User models added to the conversion family after search's systems were drawn from CONVERSION_MODELS (they stay
# out of its draws): BatchNorms with bias=False, and other norms (instance, group, layer) beside a BatchNorm.
MORE_CONVERSION_MODELS = ("no-bias", "other-norms")
# Model scenarios: how the network is trained beyond its DDP flags. "frozen-norm": every normalization's affine
# parameters do not require grad (their statistics still train, as a norm config with requires_grad=False
# does); "data-input": the network's input does not require grad (data, as users feed it; no input gradient
# is judged); "fsdp2": the network sharded by FSDP2 with mixed precision, the case's dtype the compute dtype
# (see harness.scenarios.sharded).
MODEL_OPTIONS = ("frozen-norm", "data-input", "fsdp2")
# What users do around a network holding SyncBN (model scenario; harness.scenarios.uses explains each): the
# one place the names are spelled. Activation checkpointing around every SyncBN layer or around the whole
# network, with use_reentrant=False or True; the other uses stand alone.
CHECKPOINT_USES = ("checkpoint-layer", "checkpoint-layer-reentrant", "checkpoint-block", "checkpoint-block-reentrant")
USES = CHECKPOINT_USES + ("double-backward", "autocast", "script", "join", "autocast-grad-scaler")
# torch.compile of the case's module: a backend, then optionally "fullgraph" and "dynamic" (dynamic=True)
COMPILE_BACKENDS = ("eager", "aot_eager", "inductor")
COMPILE_OPTIONS = ("fullgraph", "dynamic")
# torch's private SyncBN ops (ATen), which code outside torch calls directly (horovod, apex, detectron2): the
# private_ops scenario calls one of them per case (``Case.op``). The one place their names are spelled.
PRIVATE_OPS = ("batch_norm_stats", "batch_norm_gather_stats_with_counts", "batch_norm_elemt",
               "batch_norm_backward_reduce", "batch_norm_backward_elemt")
# An op's options: "loss-scaled", the upstream gradient a loss scaled by 2**16 gives (harness.scenarios.private_ops).
OP_OPTIONS = ("loss-scaled",)

# The dtypes a case's standard normals may be drawn in. torch draws float64 normals on CPU one value at a time
# and float32 ones vectorized, about five times faster: search, whose cases are new, draws in float32; the
# catalog's cases keep float64, since changing a case's draws would change its data under its stored records.
NORMAL_DTYPE_NAMES = ("float64", "float32")
# Where each rank's samples come from. "sequential": one generator, seeded with the case's seed, draws the
# parameters and then every step's ranks in order, so a rank's data depends on every rank before it (the
# catalog's cases). "per-rank": the parameters from that generator, each rank's samples from a generator of its
# own (:func:`rank_seed`), so a rank makes its own part alone (search's cases; see harness.engine.exchange).
DRAWS = ("sequential", "per-rank")
MEMORY_FORMAT_NAMES = ("contiguous", "channels_last", "channels_last_3d")
# How a layer case's module is made ready before its first step (``Case.setup``). "copied": built, then its
# weight, bias and running statistics set from the case's data (every catalog case before these). "as-built":
# the values its constructor gave kept (nn.BatchNorm's: weight 1, bias 0, running mean 0, variance 1), so a
# constructor that initializes otherwise shows (pytorch#12259). "factory": as built, with the constructor's
# device= and dtype= keywords (the parameter dtype) and no .to() after (pytorch#54508). "stats-off-after": built
# tracking running statistics, then ``track_running_stats = False`` set on it, as users freeze statistics:
# nn.BatchNorm then neither updates nor counts its buffers in training and normalizes eval with them.
# "legacy-state-dict": copied, its count set to LEGACY_COUNT (a layer trained before), then given back its own
# state dict without num_batches_tracked or version metadata (a hand-built or old checkpoint): nn.BatchNorm keeps
# its count (pytorch#110361). "meta-assign": built on the meta device, then load_state_dict(assign=True) of the
# case's values without num_batches_tracked, as large models are materialized: nn.BatchNorm's count becomes a real
# 0 (pytorch#115285).
SETUPS = ("copied", "as-built", "factory", "stats-off-after", "legacy-state-dict", "meta-assign")
LEGACY_COUNT = 5


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
    # code path on CPU (see harness.engine.nccl_contract); "list-contract" a backend with only the list
    # all_gather, as MPI's (see harness.engine.list_contract); "no-group" runs the case's one rank in a
    # process with no process group at all (see harness.engine.rank).
    backend: Optional[str] = None
    # Run the case's module under torch.compile, and eagerly beside it (see harness.engine.compiled):
    # (backend, *options), e.g. ("aot_eager", "fullgraph"); () runs eagerly only.
    compile: tuple[str, ...] = ()
    # Model scenarios: what the user does around the network (USES: checkpointing, a gradient penalty, autocast,
    # TorchScript, DDP's join), see harness.scenarios.uses.
    use: Optional[str] = None
    options: tuple[str, ...] = ()  # model scenarios: MODEL_OPTIONS
    # The private_ops scenario: (op, *options), the op one of PRIVATE_OPS and the options among OP_OPTIONS.
    op: tuple[str, ...] = ()
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
    # False: the layer has a weight and no bias (BatchNorm's keyword ``bias``, pytorch#176573): bias None, no bias
    # gradient; its data's bias is 0, what the missing bias adds.
    bias: bool = True
    # Upstream gradients ~ grad_scale * (grad_mean + N(0, 1)): a loss scaled as GradScaler scales it (2**16 over
    # the elements a mean divides by), whose gradient has a mean (pytorch#195701). Layer and model scenarios.
    grad_mean: float = 0.0
    grad_scale: float = 1.0
    setup: str = "copied"  # SETUPS: how a layer case's module is made ready before its first step

    def __post_init__(self) -> None:
        if len(self.spatial) != len(self.batch_sizes):
            raise ValueError(f"case {self.id}: one spatial shape per rank needed")
        if len({len(s) for s in self.spatial}) != 1:
            raise ValueError(f"case {self.id}: every rank needs the same number of dims")
        if self.dtype not in DTYPE_NAMES or self.param_dtype not in DTYPE_NAMES:
            raise ValueError(f"case {self.id}: dtype must be one of {sorted(DTYPE_NAMES)}")
        if self.memory_format not in MEMORY_FORMAT_NAMES:
            raise ValueError(f"case {self.id}: memory_format must be one of {sorted(MEMORY_FORMAT_NAMES)}")
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
        if self.backend == NO_GROUP and (len(self.batch_sizes) != 1 or self.groups):
            raise ValueError(f"case {self.id}: a case without a process group has one rank and no subgroups")
        if self.compile and (self.compile[0] not in COMPILE_BACKENDS or len(set(self.compile[1:])) != len(
                self.compile) - 1 or any(o not in COMPILE_OPTIONS for o in self.compile[1:])):
            raise ValueError(f"case {self.id}: compile is (backend, *options) with a backend of {COMPILE_BACKENDS} "
                             f"and options among {COMPILE_OPTIONS}, got {self.compile}")
        if any(o not in MODEL_OPTIONS for o in self.options):
            raise ValueError(f"case {self.id}: options are among {', '.join(MODEL_OPTIONS)}, got {self.options}")
        if self.op and (self.op[0] not in PRIVATE_OPS or any(o not in OP_OPTIONS for o in self.op[1:])
                        or self.scenario != "private_ops"):
            raise ValueError(f"case {self.id}: op is (op, *options) with an op of {', '.join(PRIVATE_OPS)} and "
                             f"options among {OP_OPTIONS}, for the private_ops scenario; got {self.op} for the "
                             f"{self.scenario} scenario")
        if self.normals not in NORMAL_DTYPE_NAMES:
            raise ValueError(f"case {self.id}: normals must be one of {', '.join(NORMAL_DTYPE_NAMES)}, "
                             f"got {self.normals!r}")
        if self.draws not in DRAWS:
            raise ValueError(f"case {self.id}: draws must be one of {', '.join(DRAWS)}, got {self.draws!r}")
        if self.rank_seeds and (self.draws != "per-rank" or len(self.rank_seeds) != self.world_size):
            raise ValueError(f"case {self.id}: rank_seeds needs draws='per-rank' and one seed per rank, got "
                             f"{list(self.rank_seeds)} for {self.world_size} ranks drawn {self.draws}")
        if self.setup not in SETUPS or self.setup != "copied" and (self.scenario != "layer" or self.model):
            raise ValueError(f"case {self.id}: setup must be one of {', '.join(SETUPS)}, and other than 'copied' "
                             f"for a layer case only (scenario 'layer', no model); got {self.setup!r}")
        if self.setup in ("stats-off-after", "legacy-state-dict") and not self.track_running_stats:
            raise ValueError(f"case {self.id}: setup {self.setup!r} is about running statistics the layer was "
                             "built with: it needs track_running_stats=True")
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
            "bias": self.bias,
            "grad_mean": self.grad_mean,
            "grad_scale": self.grad_scale,
            "op": list(self.op),
            "setup": self.setup,
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
        for key in ("batch_sizes", "steps", "constant_channels", "ddp", "compile", "options", "op", "rank_seeds"):
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


def rank_seed(seed: int, rank: int) -> int:
    """The seed of rank ``rank``'s own generator in a case whose samples are drawn per rank."""
    return seed * 65537 + rank + 1
