"""The model scenario: SyncBN inside a small network, optionally under DistributedDataParallel and an optimizer.

Per rank: the network of ``case.model`` (:mod:`harness.scenarios.networks`)
with the implementation's layers, initialized from the case's seed (or, with
the ``checkpoint-rank0`` flag, a checkpoint loaded on rank 0 only: DDP's init
sync or nothing must make the other ranks agree), wrapped in
``DistributedDataParallel`` when ``case.ddp`` is not empty, trained with
``case.optimizer`` (SGD with momentum, or Adam) on the case's per-rank batches.
In lockstep, every rank computes the float64 oracle: the same network with
batch normalization over the global batch, in one process, with the same loss
(each rank's output times its upstream gradient) and DDP's averaging of the
gradients.

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
``data-input`` (the input does not require grad). Uses (``case.use``): a
:class:`harness.scenarios.uses.Use`, asked for once per rank.

A rank's training is :class:`Training` (the network, its DDP wrapper, the
optimizer and the oracle, built once); each step is its forward, the
optimizer step, and the judgement of what they left, one method each.
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
from harness.scenarios import networks, uses
from harness.scenarios.across import Across, judge_bitwise, of_results

LR = 0.05
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
    """Why this build cannot run the case (a DDP flag it lacks, a flag the harness does not know)."""
    ddp = DdpOptions.parse(case.ddp)
    if ddp.unknown:
        return f"unknown DDP flags {list(ddp.unknown)}"
    if "forward_sync_buffers" in dict(ddp.arguments):
        from torch.nn.parallel import DistributedDataParallel

        if "forward_sync_buffers" not in inspect.signature(DistributedDataParallel.__init__).parameters:
            return f"torch {torch.__version__}'s DistributedDataParallel has no forward_sync_buffers"
    return None


def upstream(case: Case, step: int, shapes: list) -> list[torch.Tensor]:
    """Each rank's gradient of the loss with respect to its output at ``step`` (from the case's seed), drawn as
    ``grad_scale * (grad_mean + N(0, 1))``."""
    gen = torch.Generator().manual_seed(case.seed * 31 + 1000 + step)
    out = [torch.randn(shape, generator=gen, dtype=torch.float64) for shape in shapes]
    if case.grad_mean != 0.0 or case.grad_scale != 1.0:
        out = [(g + case.grad_mean) * case.grad_scale for g in out]
    return out


def _optimizer(case: Case, params):
    if case.optimizer == "adam":
        return torch.optim.Adam(params, lr=LR / 10)
    if case.optimizer == "sgd":
        return torch.optim.SGD(params, lr=LR, momentum=0.9)
    return None


def frozen_names(case: Case, layers) -> set:
    """The parameters that do not train: every normalization's weight and bias under ``frozen-norm``."""
    if "frozen-norm" not in case.options:
        return set()
    return {f"{layer[1]}.{w}" for layer in layers if layer[0] == "bn" for w in ("weight", "bias")}


class Oracle:
    """The float64 network over the global batch, stepped in lockstep with the ranks."""

    def __init__(self, case: Case, layers, state: dict, use: uses.Use):
        self.case, self.layers, self.use = case, layers, use
        self.names = networks.parameter_names(layers)
        self.frozen = frozen_names(case, layers)
        pdtype = DTYPES[case.param_dtype]
        # Start from what the ranks hold: the parameters rounded to their dtype.
        self.params = {n: state[n].to(pdtype).double().requires_grad_(n not in self.frozen) for n in self.names}
        self.buffers = {n: (v.to(pdtype).double() if v.is_floating_point() else v.clone())
                        for n, v in state.items() if n not in self.names}
        self.opt = _optimizer(case, [p for p in self.params.values() if p.requires_grad])

    def forward(self, xs: list[torch.Tensor], train: bool) -> list[torch.Tensor]:
        """Every rank's output (float64, with its graph when training); buffers updated when training."""
        self._copies = [{n: p.detach().clone().requires_grad_(train and n not in self.frozen)
                         for n, p in self.params.items()} for _ in range(len(xs))]
        self._xs = [x.to(torch.float64).requires_grad_(train) for x in xs]
        return networks.oracle_forward(self.layers, self._copies, self.buffers, self._xs, train=train,
                                       eps=self.case.eps, momentum=self.case.momentum,
                                       param_dtype=DTYPES[self.case.param_dtype])

    def backward(self, ys: list[torch.Tensor], gs: list[torch.Tensor], ddp: bool, world: int) -> tuple:
        """(each rank's input gradient, each rank's parameter-gradient shares, each rank's penalized input
        gradient or None: :meth:`harness.scenarios.uses.Use.oracle_backward`); under DDP the shares' sum over
        ``world`` accumulates into the parameters' gradients, as DDP's all-reduce does."""
        penalized = self.use.oracle_backward(ys, self._xs, gs)
        shares = [{n: c[n].grad for n in self.names} for c in self._copies]
        if ddp:
            for n, p in self.params.items():
                if n in self.frozen:
                    continue
                mean = sum(s[n] for s in shares) / world
                p.grad = mean if p.grad is None else p.grad + mean
        return [x.grad for x in self._xs], shares, penalized

    def optimizer_step(self) -> None:
        if self.opt is not None:
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        else:
            for p in self.params.values():
                p.grad = None


def _cpu(t):
    return None if t is None else t.detach().cpu().clone()


@dataclasses.dataclass
class Truth:
    """The oracle's side of one step: every rank's output and upstream gradient, and after a training step every
    rank's input gradient, parameter-gradient shares and penalized input gradient (None where the use has none)."""

    ys: list
    gs: list
    grad_inputs: Optional[list] = None
    shares: Optional[list] = None
    penalized: Optional[list] = None


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
    """One rank's network (its SyncBN layers the implementation's), its DDP wrapper, its optimizer and the float64
    oracle, and the bits of every step's tensors that must agree across ranks."""

    def __init__(self, ctx, case: Case, impl, device: str):
        self.ctx, self.case, self.impl, self.device = ctx, case, impl, device
        self.rank, self.use, self.ddp = ctx.rank, uses.of(case), DdpOptions.parse(case.ddp)
        self.layers = networks.spec(case.model, case.channels)
        self.data, self.group = materialize(case), ctx.process_group(case)
        self.pdtype = DTYPES[case.param_dtype]
        self.net, self.oracle = self._network()
        self.model = self.net  # the DDP wrapper once wrap() made it
        self.opt = _optimizer(case, [p for p in self.net.parameters() if p.requires_grad])
        self.judge = Judge.of(case, self.use, device, self.layers)
        self.call = self.use.wrap_call(impl.forward)
        out_dtype = self.use.expected_dtype(device, self.layers, lambda n: networks.Net(self.layers, n))
        self.out_dtype = out_dtype or DTYPES[case.dtype]
        self.bitwise: dict[int, dict] = {}

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
        changed for it, the rank records among the mode's notes)."""
        if not self.ddp.on:
            return
        from torch.nn.parallel import DistributedDataParallel

        impl = self.impl
        with impl.ddp_guard():
            self.model = DistributedDataParallel(self.net, **self.ddp.kwargs(self.group))

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
        truth = self._truth(s, xs, train)
        x, y, mine = self._forward(s, kind, xs[rank], truth.gs[rank], train, alone)
        judge = self.judge.at(s, STEP_KINDS[kind], sum(int(x.numel() // x.shape[1]) for x in xs))
        judge("output", y, truth.ys[rank].detach(), self.out_dtype)
        if train and x.requires_grad:
            judge("grad_input", x.grad, truth.grad_inputs[rank], DTYPES[case.dtype])
        if truth.penalized is not None:
            judge("penalized_grad_input", mine, truth.penalized[rank], DTYPES[case.dtype])
        bitwise = self._optimizer_step(judge, truth) if train and self._steps_optimizer(s) else {}
        bitwise.update(judge_buffers(self.net.named_buffers(), self.oracle.buffers, judge, self.judge.metrics,
                                     lambda name: step_key(s, STEP_KINDS[kind], name), self.pdtype))
        self.bitwise[s] = bitwise

    def _steps_optimizer(self, s: int) -> bool:
        """Whether a training step ``s`` ends with an optimizer step: always without DDP; under ``no_sync=K``,
        only the last of every K micro-batches (the others accumulate under ``no_sync()``)."""
        return not self.ddp.on or (s + 1) % self.ddp.accumulation == 0

    def _truth(self, s: int, xs: list, train: bool) -> Truth:
        """The oracle's forward of step ``s`` over every active rank's input (and its backward when training)."""
        ys = self.oracle.forward(xs, train)
        truth = Truth(ys, upstream(self.case, s, [tuple(y.shape) for y in ys]))
        if train:
            truth.grad_inputs, truth.shares, truth.penalized = self.oracle.backward(ys, truth.gs, self.ddp.on,
                                                                                    self.case.world_size)
        return truth

    def _forward(self, s: int, kind: str, x: torch.Tensor, dy: torch.Tensor, train: bool, alone: bool) -> tuple:
        """This rank's forward and backward of step ``s``: (its input, its output, its penalized input gradient or
        None). Under ``no_sync=K`` the first K-1 micro-batches skip DDP's all-reduce; a step some ranks
        evaluate alone must issue no collective."""
        ws = self.case.world_size
        x = x.to(self.device).detach().clone().requires_grad_(train and "data-input" not in self.case.options)
        sync = self.model.no_sync() if train and not self._steps_optimizer(s) else contextlib.nullcontext()
        quiet = self.ctx.forbid_collectives(f"evaluation on ranks {[r for r in range(ws) if evaluates(kind, r, ws)]} "
                                            "alone") if alone else contextlib.nullcontext()
        with sync, quiet:
            with self.use.forward_context(self.device):
                y = self.call(self.net if alone else self.model, x)
            mine = self.use.backward(y, x, dy.to(device=self.device, dtype=y.dtype)) if train else None
        return x, y, mine

    def _optimizer_step(self, judge: Callable, truth: Truth) -> dict:
        """Judge the gradients, step the optimizer (and the oracle's), judge the parameters and optimizer state.
        Returns the bits that must agree across ranks (under DDP the gradients; parameters and state always)."""
        bitwise: dict = {}
        for name, p in self.net.named_parameters():
            if not p.requires_grad:
                continue  # frozen: no gradient to judge (its value is judged below: it must not move)
            judge(f"grad.{name}", p.grad, self.oracle.params[name].grad if self.ddp.on else
                  truth.shares[self.rank][name], self.pdtype)
            if self.ddp.on:
                bitwise[f"grad.{name}"] = bits(p.grad)
        if self.opt is not None:
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        else:
            self.net.zero_grad(set_to_none=True)
        self.oracle.optimizer_step()
        for name, p in self.net.named_parameters():
            judge(f"param.{name}", p, self.oracle.params[name].detach(), self.pdtype)
            bitwise[f"param.{name}"] = bits(p)
        for name, p in (self.net.named_parameters() if self.opt is not None else ()):
            for slot, value in self.opt.state[p].items():
                if torch.is_tensor(value) and value.is_floating_point() and value.dim():
                    judge(f"opt.{name}.{slot}", value, self.oracle.opt.state[self.oracle.params[name]][slot].detach())
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
