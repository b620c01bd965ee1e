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

DDP flags (``case.ddp``): ``broadcast_buffers=False``,
``forward_sync_buffers=False`` (releases that have it), ``static_graph``,
``find_unused_parameters``, ``gradient_as_bucket_view``,
``bucket_cap_mb=0.0001`` (one bucket per parameter), ``no_sync=K`` (K
micro-batches accumulated per optimizer step, the first K-1 under
``no_sync()``), ``checkpoint-rank0``; ``ddp`` alone: DDP with defaults.
Options (``case.options``): ``frozen-norm`` (the normalizations' affine
parameters do not train, their statistics do), ``data-input`` (the input
does not require grad). Uses (``case.use``): :mod:`harness.scenarios.uses`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from functools import partial
from typing import Optional

import torch

from harness.catalog.case import STEP_KINDS, Case, evaluates
from harness.catalog.data import DTYPES, materialize
from harness.judge.compare import compare_tensor
from harness.judge.invariants import bits, compare_across
from harness.judge.metric import Metric
from harness.judge.metric_key import step_key
from harness.judge.network_budget import network_tolerance
from harness.scenarios import networks, uses

LR = 0.05
FLAGS = ("ddp", "broadcast_buffers=False", "forward_sync_buffers=False", "static_graph", "find_unused_parameters",
         "gradient_as_bucket_view", "bucket_cap_mb=0.0001", "checkpoint-rank0")


def accumulation(case: Case) -> int:
    """Micro-batches per optimizer step (``no_sync=K``), 1 without."""
    return next((int(f.split("=")[1]) for f in case.ddp if f.startswith("no_sync=")), 1)


def unsupported_reason(case: Case, impl, device: str, backend: str) -> Optional[str]:
    """Why this build cannot run the case (a DDP flag it lacks, a flag the harness does not know)."""
    unknown = [f for f in case.ddp if f not in FLAGS and not f.startswith("no_sync=")]
    if unknown:
        return f"unknown DDP flags {unknown}"
    if "forward_sync_buffers=False" in case.ddp:
        from torch.nn.parallel import DistributedDataParallel

        if "forward_sync_buffers" not in inspect.signature(DistributedDataParallel.__init__).parameters:
            return f"torch {torch.__version__}'s DistributedDataParallel has no forward_sync_buffers"
    return None


def upstream(case: Case, step: int, shapes: list) -> list[torch.Tensor]:
    """Each rank's gradient of the loss with respect to its output at ``step`` (from the case's seed)."""
    gen = torch.Generator().manual_seed(case.seed * 31 + 1000 + step)
    return [torch.randn(shape, generator=gen, dtype=torch.float64) for shape in shapes]


def _ddp_kwargs(case: Case, group) -> dict:
    kw: dict = {"process_group": group}
    for flag in case.ddp:
        if flag in ("broadcast_buffers=False", "forward_sync_buffers=False", "bucket_cap_mb=0.0001"):
            name, value = flag.split("=")
            kw[name] = float(value) if name == "bucket_cap_mb" else False
        elif flag in ("static_graph", "find_unused_parameters", "gradient_as_bucket_view"):
            kw[flag] = True
    return kw


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

    def __init__(self, case: Case, layers, state: dict):
        self.case, self.layers = case, layers
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
        gradient or None, see :mod:`harness.scenarios.uses`); under DDP the shares' sum over ``world``
        accumulates into the parameters' gradients, as DDP's all-reduce does."""
        penalized = uses.oracle_backward(self.case, ys, self._xs, gs)
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


def run_rank(ctx, case: Case, impl, device: str, result, compare_with: Optional[str] = None) -> None:
    """Train the case's network on this rank beside the float64 oracle and judge every step."""
    rank, ws = ctx.rank, case.world_size
    layers = networks.spec(case.model, case.channels)
    state = networks.init_state(layers, case.seed + 7)
    checkpoint = networks.init_state(layers, case.seed + 11) if "checkpoint-rank0" in case.ddp else None
    data = materialize(case)
    pdtype = DTYPES[case.param_dtype]
    group = ctx.process_group(case)
    layer_case = dataclasses.replace(case, model=None, scenario="layer")

    def norm(c: int):
        return uses.prepare_layer(case, impl.build(dataclasses.replace(layer_case, channels=c), group, device))

    net = networks.Net(layers, norm, uses.layer_call(case)).to(device=device, dtype=pdtype)
    own = checkpoint if checkpoint is not None and rank == 0 else state
    with torch.no_grad():
        current = dict(net.named_parameters()) | dict(net.named_buffers())
        for name, value in own.items():
            current[name].copy_(value)
    oracle = Oracle(case, layers, checkpoint if checkpoint is not None else state)
    for name, p in net.named_parameters():
        p.requires_grad_(name not in oracle.frozen)
    ddp = bool(case.ddp)
    model = net
    if ddp:
        from torch.nn.parallel import DistributedDataParallel

        with impl.ddp_guard():
            model = DistributedDataParallel(net, **_ddp_kwargs(case, group))
        if impl.ddp_note:
            result.mode = f"{impl.mode}; {impl.ddp_note}"
    opt = _optimizer(case, [p for p in net.parameters() if p.requires_grad])
    k = accumulation(case)
    depth = networks.depth(layers)
    metrics: list[tuple[str, Metric]] = []
    across: dict = {}
    call = uses.wrap_call(case, impl.forward)
    rounding = uses.autocast_dtype(case, device)  # autocast rounds to its dtype: judge with that dtype's rounding
    tol_case = dataclasses.replace(case, dtype=str(rounding).split(".")[-1]) if rounding else case
    slack = uses.AUTOCAST_SLACK if rounding else 1.0
    out_dtype = uses.expected_dtype(case, device, layers, lambda n: networks.Net(layers, n)) or DTYPES[case.dtype]

    def step(s: int, kind: str) -> None:
        train = STEP_KINDS[kind] == "train"
        alone = not all(evaluates(kind, r, ws) for r in range(ws))
        active = uses.active_ranks(case, s)
        (model if not alone else net).train(train)
        xs = [data.inputs[s][r] for r in range(active)]
        ys = oracle.forward(xs, train)
        gs = upstream(case, s, [tuple(y.shape) for y in ys])
        grad_inputs, shares, penalized = oracle.backward(ys, gs, ddp, ws) if train else (None, None, None)
        reduction = sum(int(x.numel() // x.shape[1]) for x in xs)
        x = xs[rank].to(device).detach().clone().requires_grad_(train and "data-input" not in case.options)
        last_micro = (s + 1) % k == 0
        sync = contextlib.nullcontext() if (not ddp or last_micro or not train) else model.no_sync()
        quiet = ctx.forbid_collectives(f"evaluation on ranks {[r for r in range(ws) if evaluates(kind, r, ws)]} "
                                       "alone") if alone else contextlib.nullcontext()
        with sync, quiet:
            with uses.forward_context(case, device):
                y = call(net if alone else model, x)
            mine = uses.backward(case, y, x, gs[rank].to(device=device, dtype=y.dtype)) if train else None
        key = partial(step_key, s, STEP_KINDS[kind])

        def judge(name, got, true, dtype=None, key=key, reduction=reduction, s=s):
            tol = network_tolerance(true, tol_case, reduction, depth, s, normwise=bool(rounding)) * slack
            metrics.append((key(name), compare_tensor(_cpu(got), true, tol, dtype=dtype)))

        judge("output", y, ys[rank].detach(), out_dtype)
        if train and x.requires_grad:
            judge("grad_input", x.grad, grad_inputs[rank], DTYPES[case.dtype])
        if penalized is not None:
            judge("penalized_grad_input", mine, penalized[rank], DTYPES[case.dtype])
        bitwise: dict = {}
        step_done = train and (not ddp or last_micro)
        if step_done:
            for name, p in net.named_parameters():
                if not p.requires_grad:
                    continue  # frozen: no gradient to judge (its value is judged below: it must not move)
                true = oracle.params[name].grad if ddp else shares[rank][name]
                judge(f"grad.{name}", p.grad, true, pdtype)
                if ddp:
                    bitwise[f"grad.{name}"] = bits(p.grad)
            if opt is not None:
                opt.step()
                opt.zero_grad(set_to_none=True)
            else:
                net.zero_grad(set_to_none=True)
            oracle.optimizer_step()
            for name, p in net.named_parameters():
                judge(f"param.{name}", p, oracle.params[name].detach(), pdtype)
                bitwise[f"param.{name}"] = bits(p)
            if opt is not None:
                for name, p in net.named_parameters():
                    p64 = oracle.params[name]
                    for slot, value in opt.state[p].items():
                        if torch.is_tensor(value) and value.is_floating_point() and value.dim():
                            judge(f"opt.{name}.{slot}", value, oracle.opt.state[p64][slot].detach())
                            bitwise[f"opt.{name}.{slot}"] = bits(value)
        bitwise.update(judge_buffers(net.named_buffers(), oracle.buffers, judge, metrics, key, pdtype))
        across[str(s)] = bitwise
    with contextlib.ExitStack() as joined:
        if case.use == "join":
            joined.enter_context(model.join())
        for s, kind in enumerate(case.steps):
            if s >= uses.batches(case, rank) or not evaluates(kind, rank, ws):
                continue  # this rank has no batch left (join), or does not evaluate (validation on a subset)
            ctx.mark_step(s)
            step(s, kind)
    result.across["bitwise"] = across
    result.metrics = dict(metrics)


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
    out = []
    groups = [list(g) for g in (case.groups or [tuple(range(case.world_size))])]
    per = {r.rank: r.across.get("bitwise", {}) for r in results}
    steps = sorted({s for b in per.values() for s in b}, key=int)
    for s in steps:
        names = sorted({n for b in per.values() for n in b.get(s, {})})
        kind = STEP_KINDS[case.steps[int(s)]]
        for name in names:
            bad = compare_across(step_key(s, kind, name), {r: b.get(s, {}).get(name) for r, b in per.items()},
                                 groups)
            if bad is not None:
                out.append((step_key(s, kind, name, across_ranks=True), bad))
    return out

