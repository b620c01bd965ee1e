"""The model scenario: SyncBN inside a small network, optionally under DDP or FSDP2 and an optimizer.

Per rank: the network of ``case.model`` (:mod:`harness.scenarios.networks`)
with the implementation's layers, initialized from the case's seed (or, with
the ``checkpoint-rank0`` flag, a checkpoint loaded on rank 0 only: DDP's init
sync or nothing must make the other ranks agree), wrapped in
``DistributedDataParallel`` when ``case.ddp`` is not empty or sharded by FSDP2
under an ``fsdp2`` option (:mod:`harness.scenarios.sharded`), trained with
``case.optimizer`` (SGD with momentum, or Adam) on the case's per-rank batches.
In lockstep, every rank computes the float64 oracle
(:mod:`harness.scenarios.network_oracle`): the same network with batch
normalization over the global batch, in one process, with the same loss (each
rank's output times its upstream gradient) and DDP's (FSDP2's) averaging of
the gradients. A ``fwd`` step is a training forward whose backward comes with
the next ``train`` step, of the sum of both losses (two forwards, one backward,
as GAN discriminators train: pytorch#175024 under DDP); its input gradient is
judged then.

After every step the rank compares its output and input gradient, and after
every optimizer step (or, without DDP, every backward) its gradients (DDP's
averaged ones, or without DDP its own share), parameters, optimizer state and
every normalization's buffers with the oracle. Across ranks (in the parent):
the buffers, and under DDP the averaged gradients, the parameters and the
optimizer state after each step must be bitwise the same on every rank.

DDP flags (``case.ddp``, parsed once into :class:`DdpOptions`):
``broadcast_buffers=False``, ``forward_sync_buffers=False`` (releases that
have it), ``static_graph``, ``find_unused_parameters``,
``gradient_as_bucket_view``, ``bucket_cap_mb=0.0001`` (one bucket per
parameter), ``no_sync=K`` (K micro-batches accumulated per optimizer step,
the first K-1 under ``no_sync()``), ``checkpoint-rank0``; ``ddp`` alone: DDP
with defaults. ``checkpoint-rank0`` is a condition of DDP's construction
(its broadcast from rank 0 must make the ranks agree), not a use: it stays
among the flags. Options (``case.options``): ``frozen-norm`` (the
normalizations' affine parameters do not train, their statistics do),
``data-input`` (the input does not require grad), ``fsdp2`` (FSDP2 with
mixed precision). Uses (``case.use``): a
:class:`harness.scenarios.uses.Use`, asked for once per rank; it also runs the
backward and the optimizer step (a loss scaler's).

A rank's training is :class:`Training` (the network, its DDP or FSDP2
wrapper, the optimizer and the oracle, built once); each step is its forward,
the backward, the optimizer step, and the judgement of what they left.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from typing import Callable, Optional

import torch

from harness.catalog.case import STEP_KINDS, Case, evaluates
from harness.catalog.data import DTYPES, materialize
from harness.judge.compare import compare_tensor
from harness.judge.invariants import bits
from harness.judge.metric import Metric
from harness.judge.metric_key import step_key
from harness.judge.network_budget import network_tolerance
from harness.scenarios import networks, sharded, uses
from harness.scenarios.across import Across, judge_bitwise, of_results
from harness.scenarios.network_oracle import Oracle, Truth, optimizer_of, upstream
# The DDP flags that are a constructor argument, and the argument they set.
DDP_ARGUMENTS = {"broadcast_buffers=False": ("broadcast_buffers", False),
                 "forward_sync_buffers=False": ("forward_sync_buffers", False),
                 "bucket_cap_mb=0.0001": ("bucket_cap_mb", 0.0001), "static_graph": ("static_graph", True),
                 "find_unused_parameters": ("find_unused_parameters", True),
                 "gradient_as_bucket_view": ("gradient_as_bucket_view", True)}
FLAGS = ("ddp", *DDP_ARGUMENTS, "checkpoint-rank0")  # and no_sync=K


@dataclasses.dataclass(frozen=True)
class DdpOptions:
    """``case.ddp`` parsed: whether DDP wraps the network, its constructor's arguments, ``no_sync`` accumulation,
    whether rank 0 alone loads a checkpoint before DDP is built, and the flags the harness does not know."""

    on: bool = False
    arguments: tuple[tuple[str, object], ...] = ()
    accumulation: int = 1  # micro-batches per optimizer step (no_sync=K)
    rank0_checkpoint: bool = False
    unknown: tuple[str, ...] = ()

    @classmethod
    def parse(cls, flags) -> "DdpOptions":
        """The options of a case's DDP flags (any flag at all turns DDP on)."""
        arguments, unknown, accumulation = [], [], None
        for flag in flags:
            count = flag.removeprefix("no_sync=")
            if flag in DDP_ARGUMENTS:
                arguments.append(DDP_ARGUMENTS[flag])
            elif count != flag and count.isdigit():
                accumulation = accumulation or int(count)
            elif flag not in FLAGS:
                unknown.append(flag)
        return cls(on=bool(flags), arguments=tuple(arguments), accumulation=accumulation or 1,
                   rank0_checkpoint="checkpoint-rank0" in flags, unknown=tuple(unknown))

    def kwargs(self, group) -> dict:
        """``DistributedDataParallel``'s keyword arguments over ``group``."""
        return {"process_group": group, **dict(self.arguments)}


def unsupported_reason(case: Case, impl, device: str, backend: str) -> Optional[str]:
    """Why this build cannot run the case (a DDP flag it lacks, a flag the harness does not know, FSDP2 or a use
    that needs what the case lacks, two forwards with what cannot take them)."""
    ddp = DdpOptions.parse(case.ddp)
    if ddp.unknown:
        return f"unknown DDP flags {list(ddp.unknown)}"
    use = uses.of(case)
    if use.needs_optimizer() and case.optimizer is None:
        return f"{case.use} steps an optimizer: the case names none"
    if case.optimizer and not (ddp.on or sharded.fsdp2_of(case)):
        return "an optimizer without DDP or FSDP2 steps each rank's network on its own gradients: they part"
    if "fwd" in case.steps and (ddp.accumulation > 1 or case.use in ("join", "double-backward")):
        return "two forwards before one backward ('fwd' steps) with no_sync accumulation, join or a penalty"
    reason = sharded.fsdp2_unsupported(case)
    if reason:
        return reason
    if "forward_sync_buffers" in dict(ddp.arguments):
        from torch.nn.parallel import DistributedDataParallel

        if "forward_sync_buffers" not in inspect.signature(DistributedDataParallel.__init__).parameters:
            return f"torch {torch.__version__}'s DistributedDataParallel has no forward_sync_buffers"
    return None


def _cpu(t):
    return None if t is None else t.detach().cpu().clone()


@dataclasses.dataclass
class Judge:
    """A rank's tensors against the oracle's under the model budget (coarser, normwise, under autocast)."""

    case: Case  # the case the budget is of (under autocast: in the autocast dtype, whose rounding it has)
    depth: int
    normwise: bool = False
    slack: float = 1.0
    metrics: list = dataclasses.field(default_factory=list)

    @classmethod
    def of(cls, case: Case, use: uses.Use, device: str, layers) -> "Judge":
        """The judge of ``case``'s network under ``use`` on ``device``."""
        rounding = use.autocast_dtype(device)  # autocast rounds to its dtype: judge with that dtype's rounding
        if rounding is None and sharded.fsdp2_of(case):
            rounding = DTYPES[case.dtype]  # FSDP2's mixed precision: every layer computes in the case's dtype
        if rounding is None:
            return cls(case, networks.depth(layers))
        return cls(dataclasses.replace(case, dtype=str(rounding).split(".")[-1]), networks.depth(layers),
                   normwise=True, slack=uses.AUTOCAST_SLACK)

    def at(self, step: int, phase: str, reduction: int) -> Callable:
        """``judge(name, got, true, dtype=None)`` for step ``step`` (``reduction`` values per channel)."""

        def judge(name: str, got, true: torch.Tensor, dtype=None) -> None:
            tol = network_tolerance(true, self.case, reduction, self.depth, step, normwise=self.normwise)
            self.metrics.append((step_key(step, phase, name), compare_tensor(_cpu(got), true, tol * self.slack,
                                                                              dtype=dtype)))
        return judge


class Training:
    """One rank's network (its SyncBN layers the implementation's), its DDP or FSDP2 wrapper, its optimizer and the
    float64 oracle, the forwards awaiting their backward, and the bits of every step's tensors that must agree
    across ranks."""

    def __init__(self, ctx, case: Case, impl, device: str):
        self.ctx, self.case, self.impl, self.device = ctx, case, impl, device
        self.rank, self.use, self.ddp = ctx.rank, uses.of(case), DdpOptions.parse(case.ddp)
        # The gradients averaged over the ranks: DDP's all-reduce, FSDP2's reduce-scatter.
        self.averaged = self.ddp.on or sharded.fsdp2_of(case) is not None
        self.layers = networks.spec(case.model, case.channels)
        self.data, self.group = materialize(case), ctx.process_group(case)
        self.pdtype = DTYPES[case.param_dtype]
        self.net, self.oracle = self._network()
        self.model = self.net  # the DDP wrapper once wrap() made it
        self.opt = None  # made by wrap(), over the parameters the wrapper leaves (FSDP2 replaces them by shards)
        self.judge = Judge.of(case, self.use, device, self.layers)
        self.call = self.use.wrap_call(impl.forward)
        out_dtype = self.use.expected_dtype(device, self.layers, lambda n: networks.Net(self.layers, n))
        self.out_dtype = out_dtype or DTYPES[case.dtype]
        self.bitwise: dict[int, dict] = {}
        self.pending: list = []  # training forwards awaiting their backward: (input, output, truth, judge)

    def _network(self) -> tuple:
        """(this rank's network, the oracle), from the case's initial state (rank 0's checkpoint on rank 0 for
        ``checkpoint-rank0``: DDP's construction must make the other ranks agree)."""
        case, layers = self.case, self.layers
        state = networks.init_state(layers, case.seed + 7)
        checkpoint = networks.init_state(layers, case.seed + 11) if self.ddp.rank0_checkpoint else None
        layer_case = dataclasses.replace(case, model=None, scenario="layer")

        def norm(c: int):
            built = self.impl.build(dataclasses.replace(layer_case, channels=c), self.group, self.device)
            return self.use.prepare_layer(built)

        net = networks.Net(layers, norm, self.use.layer_call()).to(device=self.device, dtype=self.pdtype)
        own = checkpoint if checkpoint is not None and self.rank == 0 else state
        with torch.no_grad():
            current = dict(net.named_parameters()) | dict(net.named_buffers())
            for name, value in own.items():
                current[name].copy_(value)
        oracle = Oracle(case, layers, checkpoint if checkpoint is not None else state, self.use)
        for name, p in net.named_parameters():
            p.requires_grad_(name not in oracle.frozen)
        return net, oracle

    def wrap(self) -> None:
        """Wrap the network in ``DistributedDataParallel`` when the case has DDP flags (what the adapter's guard
        changed for it, the rank records among the mode's notes), or shard it under its FSDP2 option; then make
        the optimizer, over the parameters that train."""
        if self.ddp.on:
            from torch.nn.parallel import DistributedDataParallel

            with self.impl.ddp_guard():
                self.model = DistributedDataParallel(self.net, **self.ddp.kwargs(self.group))
        elif sharded.fsdp2_of(self.case):
            norms = [getattr(self.net, layer[1]) for layer in self.layers if layer[0] == "bn"]
            self.model = sharded.shard_network(self.ctx, self.case, self.net, norms)
        self.opt = optimizer_of(self.case, [p for p in self.net.parameters() if p.requires_grad])

    def run(self) -> None:
        """Every step this rank has a batch for and takes part in, inside the use's context."""
        case, ws = self.case, self.case.world_size
        with self.use.around_steps(self.model):
            for s, kind in enumerate(case.steps):
                if s >= self.use.batches(case, self.rank) or not evaluates(kind, self.rank, ws):
                    continue  # this rank has no batch left (join), or does not evaluate (validation on a subset)
                self.ctx.mark_step(s)
                self.step(s, kind)

    def step(self, s: int, kind: str) -> None:
        """Step ``s`` on this rank and on the oracle, then the judgement of every tensor it touched."""
        case, rank, ws = self.case, self.rank, self.case.world_size
        train = STEP_KINDS[kind] == "train"
        alone = not all(evaluates(kind, r, ws) for r in range(ws))
        (self.model if not alone else self.net).train(train)
        xs = [self.data.inputs[s][r] for r in range(self.use.active_ranks(case, s))]
        ys = self.oracle.forward(xs, train)
        truth = Truth(ys, upstream(case, s, [tuple(y.shape) for y in ys]))
        judge = self.judge.at(s, STEP_KINDS[kind], sum(int(x.numel() // x.shape[1]) for x in xs))
        y = self._forward(s, kind, xs[rank], truth, judge, train, alone)
        judge("output", y, truth.ys[rank].detach(), self.out_dtype)
        stepped = train and kind != "fwd" and self._steps_optimizer(s)
        bitwise = self._optimizer_step(s, judge, truth) if stepped else {}
        bitwise.update(judge_buffers(self.net.named_buffers(), self.oracle.buffers, judge, self.judge.metrics,
                                     lambda name: step_key(s, STEP_KINDS[kind], name), self.pdtype))
        self.bitwise[s] = bitwise

    def _steps_optimizer(self, s: int) -> bool:
        """Whether a training step ``s`` ends with an optimizer step: always without DDP; under ``no_sync=K``,
        only the last of every K micro-batches (the others accumulate under ``no_sync()``)."""
        return not self.ddp.on or (s + 1) % self.ddp.accumulation == 0

    def _forward(self, s: int, kind: str, x: torch.Tensor, truth: Truth, judge: Callable, train: bool,
                 alone: bool) -> torch.Tensor:
        """This rank's forward of step ``s`` (its output) and, ending a training step that is not a ``fwd`` one,
        the backward of every forward awaiting it (:meth:`_backward`). Under ``no_sync=K`` the first K-1
        micro-batches skip DDP's all-reduce; a step some ranks evaluate alone must issue no collective."""
        ws = self.case.world_size
        x = x.to(self.device).detach().clone().requires_grad_(train and "data-input" not in self.case.options)
        sync = self.model.no_sync() if train and not self._steps_optimizer(s) else contextlib.nullcontext()
        quiet = self.ctx.forbid_collectives(f"evaluation on ranks {[r for r in range(ws) if evaluates(kind, r, ws)]} "
                                            "alone") if alone else contextlib.nullcontext()
        with sync, quiet:
            with self.use.forward_context(self.device):
                y = self.call(self.net if alone else self.model, x)
            if train:
                self.pending.append((x, y, truth, judge))
                if kind != "fwd":
                    self._backward()
        return y

    def _backward(self) -> None:
        """The backward of the forwards awaiting it (this step's, after a ``fwd`` step's), of the sum of their
        losses, on this rank (through the use) and on the oracle; then each forward's input gradient judged (divided
        by a loss scaler's scale) with that forward's step."""
        forwards, self.pending = self.pending, []
        rank, dtype = self.rank, DTYPES[self.case.dtype]
        dys = [truth.gs[rank].to(device=self.device, dtype=y.dtype) for _, y, truth, _ in forwards]
        mine = self.use.backward([f[1] for f in forwards], [f[0] for f in forwards], dys)
        self.oracle.backward([f[2] for f in forwards], self.averaged, self.case.world_size)
        scale = self.use.input_grad_scale()
        for i, (x, _, truth, judge) in enumerate(forwards):
            if x.requires_grad:
                judge("grad_input", x.grad if scale == 1.0 else x.grad / scale, truth.grad_inputs[rank], dtype)
            if truth.penalized is not None:
                judge("penalized_grad_input", mine[i], truth.penalized[rank], dtype)

    def _optimizer_step(self, s: int, judge: Callable, truth: Truth) -> dict:
        """Judge the gradients (unscaled by the use first), step the optimizer through the use (and the oracle's),
        judge the parameters and optimizer state (whole, where FSDP2 shards them). Returns the bits that must agree
        across ranks (where the gradients are averaged, those; parameters and state always)."""
        bitwise: dict = {}
        if self.opt is not None:
            self.use.unscale(self.opt)
        for name, p in self.net.named_parameters():
            if not p.requires_grad:
                continue  # frozen: no gradient to judge (its value is judged below: it must not move)
            grad = sharded.full_tensor(p.grad)
            judge(f"grad.{name}", grad, self.oracle.params[name].grad if self.averaged else
                  truth.shares[self.rank][name], self.pdtype)
            if self.averaged:
                bitwise[f"grad.{name}"] = bits(grad)
        if self.opt is not None:
            for problem in self.use.step(self.opt):
                self.judge.metrics.append((step_key(s, "train", "optimizer_step"), Metric.failure(problem)))
            self.opt.zero_grad(set_to_none=True)
        else:
            self.net.zero_grad(set_to_none=True)
        self.oracle.optimizer_step()
        with torch.no_grad():
            for name, p in self.net.named_parameters():
                value = sharded.full_tensor(p)
                judge(f"param.{name}", value, self.oracle.params[name].detach(), self.pdtype)
                bitwise[f"param.{name}"] = bits(value)
            for name, p in (self.net.named_parameters() if self.opt is not None else ()):
                for slot, value in self.opt.state[p].items():
                    value = sharded.full_tensor(value)
                    if torch.is_tensor(value) and value.is_floating_point() and value.dim():
                        judge(f"opt.{name}.{slot}", value,
                              self.oracle.opt.state[self.oracle.params[name]][slot].detach())
                        bitwise[f"opt.{name}.{slot}"] = bits(value)
        return bitwise


def run_rank(ctx, case: Case, impl, device: str, result, compare_with: Optional[str] = None) -> None:
    """Train the case's network on this rank beside the float64 oracle and judge every step."""
    training = Training(ctx, case, impl, device)
    training.wrap()
    training.run()
    result.across = Across(bitwise=training.bitwise)
    result.metrics = dict(training.judge.metrics)


def judge_buffers(buffers, truth: dict, judge, metrics: list, key, dtype) -> dict:
    """Each of ``buffers`` (name, tensor) against the oracle's of that name, ``num_batches_tracked`` exactly;
    ``judge(name, got, true, dtype)`` compares the others (in ``dtype``). Returns the judged buffers' bits, by name."""
    bitwise = {}
    for name, buf in buffers:
        true = truth.get(name)
        if true is None:
            continue
        if name.endswith("num_batches_tracked"):
            if int(buf) != int(true):
                metrics.append((key(name), Metric.failure(f"{name} {int(buf)}, expected {int(true)}")))
        else:
            judge(name, buf, true, dtype)
        bitwise[name] = bits(buf)
    return bitwise


def judge_across(case: Case, results: list) -> list[tuple[str, Metric]]:
    """Every rank's buffers (and under DDP gradients, parameters, optimizer state) must be bitwise the same."""
    return judge_bitwise(case, of_results(results))
