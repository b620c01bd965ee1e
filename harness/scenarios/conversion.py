"""The conversion scenario: a user's model of plain BatchNorms, converted by the implementation, judged by the original.

Per rank: build the case's model (:mod:`harness.scenarios.user_models`, from
the case's seed, the same on every rank), note what a faithful conversion must
keep, convert it with the implementation's converter (``Impl.convert``) and
check, before any step:

- every BatchNorm was converted (none is still of its plain class), and
  every other normalization (instance, group, layer norm) is still the same
  object of the same class;
- a BatchNorm subclass with its own ``forward`` is still one after conversion
  (or its behaviour is gone, as a fused activation disappears);
- every module's ``training`` flag, every parameter's ``requires_grad`` and
  every ``qconfig`` are what they were;
- no parameter appears that was not there (a ``bias=False`` layer's bias);
- parameters are the same objects (shared, not copied: an optimizer or a tied
  weight made before conversion still sees them), and a module registered at
  several places is still one module.

Then run the case's steps (``train``: forward and backward; ``eval``:
forward and backward with the model in eval mode; the model's own ``train()``
decides what each of its modules does). The oracle is the UNCONVERTED model
in float64 on the global batch (every rank's input concatenated), in lockstep
on every rank: a conversion that changes any behaviour shows as a difference.
Each rank compares its output, input gradient, its share of every parameter
gradient (what its own loss contributes; a frozen parameter must get none)
and every BatchNorm buffer after each step; across ranks (in the parent),
every buffer must be bitwise the same on every rank.
"""

from __future__ import annotations

from functools import partial
from typing import Optional

import torch
from torch import nn

from harness.catalog.case import STEP_KINDS, Case
from harness.catalog.data import DTYPES, materialize
from harness.judge.compare import compare_tensor
from harness.judge.metric import Metric
from harness.judge.metric_key import step_key
from harness.judge.network_budget import network_tolerance
from harness.scenarios import user_models
from harness.scenarios.across import Across
from harness.scenarios.model import judge_across, judge_buffers

__all__ = ["run_rank", "run_step", "oracle_step", "judge_across", "conversion_problems", "unsupported_reason"]


def unsupported_reason(case: Case, impl, device: str, backend: str) -> Optional[str]:
    """A model this torch cannot build (BatchNorms without bias before the keyword existed), else None."""
    return user_models.unbuildable(case.model)


def _own_forward(kind: type) -> bool:
    return kind.forward is not nn.modules.batchnorm._BatchNorm.forward


def _every(model: nn.Module, kind: str):
    """``named_parameters``/``named_buffers`` with ``remove_duplicate=False`` (``kind``: ``_parameters`` or
    ``_buffers``): every name a shared tensor is reachable by. Written out because torch before 2.0 has no
    ``remove_duplicate`` on these two, and the history runs its releases."""
    for prefix, module in model.named_modules(remove_duplicate=False):
        for name, t in getattr(module, kind).items():
            if t is not None:
                yield (f"{prefix}.{name}" if prefix else name), t


def _snapshot(model: nn.Module) -> dict:
    """What a faithful conversion keeps, read before converting."""
    modules = dict(model.named_modules(remove_duplicate=False))
    by_object: dict = {}
    for name, m in modules.items():
        by_object.setdefault(id(m), []).append(name)
    return {
        "norms": {n: type(m) for n, m in user_models.batch_norms(model).items()},
        "others": {n: (type(m), id(m)) for n, m in user_models.other_norms(model).items()},
        "training": {n: m.training for n, m in modules.items()},
        "params": {n: (id(p), p.requires_grad) for n, p in _every(model, "_parameters")},
        "qconfig": {n: m.qconfig for n, m in modules.items() if getattr(m, "qconfig", None) is not None},
        "shared": [names for names in by_object.values() if len(names) > 1],
    }


def conversion_problems(before: dict, converted: nn.Module) -> list[str]:
    """What the conversion changed that it should not have, one sentence each."""
    problems = []
    modules = dict(converted.named_modules(remove_duplicate=False))
    plain = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LazyBatchNorm1d, nn.LazyBatchNorm2d,
             nn.LazyBatchNorm3d)
    for name, kind in before["norms"].items():
        got = modules.get(name)
        if got is None:
            problems.append(f"{name} ({kind.__name__}) is missing after conversion")
        elif type(got) is kind and kind in plain:
            problems.append(f"{name} is still {kind.__name__}: not converted")
        elif kind not in plain and _own_forward(kind) and not isinstance(got, kind):
            problems.append(f"{name} was {kind.__name__}, whose forward does more than normalize; it is now "
                            f"{type(got).__name__}, and that behaviour is gone")
    for name, (kind, ident) in before.get("others", {}).items():
        got = modules.get(name)
        if got is None:
            problems.append(f"{name} ({kind.__name__}) is missing after conversion")
        elif type(got) is not kind:
            problems.append(f"{name} was {kind.__name__}, which normalizes each sample alone; it is now "
                            f"{type(got).__name__}")
        elif id(got) != ident:
            problems.append(f"{name} ({kind.__name__}) was replaced by another module")
    for name, flag in before["training"].items():
        if name in modules and modules[name].training != flag:
            problems.append(f"{name or 'the model'}: training={modules[name].training} after conversion, was {flag}")
    params = dict(_every(converted, "_parameters"))
    for name, (ident, requires_grad) in before["params"].items():
        p = params.get(name)
        if p is None:
            problems.append(f"parameter {name} is missing after conversion")
            continue
        if id(p) != ident:
            problems.append(f"parameter {name} was copied, not shared (what held it before conversion no longer "
                            "sees the trained one)")
        if p.requires_grad != requires_grad:
            problems.append(f"parameter {name}: requires_grad={p.requires_grad} after conversion, was {requires_grad}")
    for name in sorted(set(params) - set(before["params"])):
        leaf = name.rsplit(".", 1)[-1]
        problems.append(f"parameter {name} exists after conversion and was None before"
                        + (" (bias=False not carried over)" if leaf == "bias" else ""))
    for name, qconfig in before["qconfig"].items():
        if name in modules and getattr(modules[name], "qconfig", None) is not qconfig:
            problems.append(f"{name}: qconfig lost in conversion")
    for names in before["shared"]:
        objects = {id(modules[n]) for n in names if n in modules}
        if len(objects) > 1:
            problems.append(f"one module registered as {' and '.join(names)} became {len(objects)} modules")
    return problems


def _global_truth(oracle: nn.Module, xs: list, gs: list, train: bool, *, floors: Optional[dict] = None,
                  floor_rank: Optional[int] = None):
    """Each rank's output, input gradient and share of every parameter gradient, from the float64 oracle.

    A rank's share of a parameter's gradient is what its own samples contribute to the gradient of the
    whole loss (what its SyncBN backward computes, and DDP sums). Every parameter here acts on each
    sample separately (a convolution's weights, a BatchNorm's affine), so that share is the gradient of
    the module's output with respect to the parameter, with the loss's gradient kept on that rank's rows.

    ``floors`` (a dict, filled when given) gets, for rank ``floor_rank``, the magnitude of each parameter's
    gradient taken with the absolute value of the loss's gradient at every call's output: for a bias, the
    sum of the magnitudes of the terms its gradient adds up, what the gradient's rounding is proportional
    to even where the terms cancel exactly (a bias right before a normalization of the same values).
    """
    oracle.train(train)
    leaves = [x.detach().to(torch.float64).requires_grad_(True) for x in xs]
    sizes = [x.shape[0] for x in leaves]
    prefix = {id(m): n for n, m in oracle.named_modules()}
    calls: list = []  # per call of a module owning trainable parameters: (names, its own copies, output)

    # Each call gets its own leaf copy of the module's parameters, so that the gradient of a call's output
    # with respect to them is that call's direct contribution (a module called twice is two calls).
    def swap_in(module, args):
        names, copies = [], []
        for name, p in module._parameters.items():
            if p is not None and p.requires_grad:
                copy = p.detach().clone().requires_grad_(True)
                module._parameters[name] = copy
                names.append((name, p))
                copies.append(copy)
        calls.append([names, copies, None])

    def swap_out(module, args, output):
        names, _, _ = calls[-1]
        for name, p in names:
            module._parameters[name] = p
        calls[-1][2] = output

    owners = [m for m in oracle.modules() if any(p.requires_grad for p in m.parameters(recurse=False))]
    hooks = [h for m in owners for h in (m.register_forward_pre_hook(swap_in), m.register_forward_hook(swap_out))]
    try:
        y = oracle(torch.cat(leaves))
    finally:
        for h in hooks:
            h.remove()
    full_name = {id(p): (prefix[id(m)] + "." if prefix[id(m)] else "") + n
                 for m in owners for n, p in m._parameters.items() if p is not None}
    ys = [part.detach() for part in y.split(sizes)]
    loss = (y * torch.cat([g.to(torch.float64) for g in gs])).sum()
    outputs = [out for _, _, out in calls]
    grads = torch.autograd.grad(loss, leaves + outputs, retain_graph=True, allow_unused=True)
    gx = [torch.zeros_like(x) if g is None else g for x, g in zip(leaves, grads[:len(leaves)])]
    shares = [{n: torch.zeros_like(p) for n, p in oracle.named_parameters() if p.requires_grad} for _ in xs]
    bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
    for (names, copies, out), gy in zip(calls, grads[len(leaves):]):
        if gy is None:
            continue
        for r in range(len(xs)):
            if sizes[r] == 0:
                continue
            mask = torch.zeros_like(gy)
            mask[bounds[r]:bounds[r + 1]] = 1
            parts = torch.autograd.grad(out, copies, grad_outputs=gy * mask, retain_graph=True, allow_unused=True)
            for (_, p), g in zip(names, parts):
                if g is not None:
                    shares[r][full_name[id(p)]] += g
            if floors is None or r != floor_rank:
                continue
            parts = torch.autograd.grad(out, copies, grad_outputs=gy.abs() * mask, retain_graph=True,
                                        allow_unused=True)
            for (_, p), g in zip(names, parts):
                if g is not None:
                    name = full_name[id(p)]
                    floors[name] = floors.get(name, 0) + g.abs()
    return ys, gx, shares


def oracle_step(oracle: nn.Module, xs: list, kind: str) -> None:
    """The oracle's forward of a step that no rank here judges (its buffers must move all the same)."""
    oracle.train(STEP_KINDS[kind] == "train")
    with torch.no_grad():
        oracle(torch.cat([x.to(torch.float64) for x in xs]))


def run_step(case: Case, impl, device: str, rank: int, model: nn.Module, oracle: nn.Module, xs: list, gs: list,
             step: int, metrics: list, *, ranks: Optional[list] = None, averaged: bool = False) -> dict:
    """One step of the converted ``model`` on this rank beside the float64 ``oracle``; returns the buffers' bits.

    ``xs``/``gs``: every rank's input and upstream gradient (of the ranks taking part, ``ranks``, default
    all); ``averaged``: parameter gradients are the ranks' mean (under DDP), not this rank's share.
    Judgements are appended to ``metrics``.
    """
    ranks = list(range(len(xs))) if ranks is None else ranks
    me = ranks.index(rank)
    kind = case.steps[step]
    train = STEP_KINDS[kind] == "train"
    pdtype = DTYPES[case.param_dtype]
    floors: dict = {}
    ys, gx, shares = _global_truth(oracle, xs, gs, train, floors=floors, floor_rank=None if averaged else me)
    reduction = sum(int(x.numel() // x.shape[1]) for x in xs)
    depth = user_models.norm_depth(oracle)
    key = partial(step_key, step, kind)

    def judge(name, got, true, dtype=None, scale=None):
        # ``scale``: what the tolerance is relative to when ``true`` is a sum that cancels (an average of shares).
        tol = network_tolerance(true if scale is None else scale, case, reduction, depth, step)
        got = None if got is None else got.detach().cpu()
        metrics.append((key(name), compare_tensor(got, true, tol, dtype=dtype)))

    model.train(train)
    x = xs[me].to(device).detach().clone().requires_grad_(True)
    y = impl.forward(model, x)
    y.backward(gs[me].to(device=device, dtype=y.dtype))
    judge("output", y, ys[me], DTYPES[case.dtype])
    judge("grad_input", x.grad, gx[me], DTYPES[case.dtype])
    own = shares[me] if not averaged else {n: sum(sh[n] for sh in shares) / len(shares) for n in shares[me]}
    # A parameter gradient is a sum over the batch whose terms may cancel in one channel: its budget is relative
    # to the tensor's largest element (and, for an average over ranks, to the shares' magnitudes).
    scale = {n: own[n].abs() + own[n].abs().max() if own[n].numel() else own[n] for n in own}
    # And to the magnitude of the terms it sums: all that is left of a gradient whose terms cancel exactly (a
    # bias right before a normalization of the same values, trained on one batch).
    scale.update({n: scale[n] + floors[n] for n in own if n in floors})
    if averaged:
        scale = {n: scale[n] + sum(sh[n].abs() for sh in shares) / len(shares) for n in own}
    named = model.module.named_parameters() if averaged else model.named_parameters()
    for name, p in named:
        if name in own:
            judge(f"grad.{name}", p.grad, own[name], pdtype, scale.get(name))
        elif p.grad is not None and bool(p.grad.ne(0).any()):
            why = "requires_grad=False" if name in dict(oracle.named_parameters()) else "no such parameter"
            metrics.append((key(f"grad.{name}"), Metric.failure(f"{name} got a gradient, and it should get "
                                                                  f"none ({why} before conversion)")))
    model.zero_grad(set_to_none=True)
    oracle.zero_grad(set_to_none=True)
    truth = dict(_every(oracle, "_buffers"))
    inner = model.module if averaged else model
    got_buffers = dict(_every(inner, "_buffers"))
    bitwise = judge_buffers(got_buffers.items(), truth, judge, metrics, key, pdtype)
    missing = sorted(set(truth) - set(got_buffers))
    if missing:
        metrics.append((key("buffers"), Metric.failure(f"buffers missing after conversion: {missing}")))
    return bitwise


def run_rank(ctx, case: Case, impl, device: str, result, compare_with: Optional[str] = None) -> None:
    """Convert the case's model with ``impl`` on this rank, check what conversion kept, run and judge every step."""
    pdtype = DTYPES[case.param_dtype]
    model = user_models.build(case.model, case.channels, case.seed, dtype=pdtype, param_dtype=pdtype)
    oracle = user_models.build(case.model, case.channels, case.seed, dtype=torch.float64, param_dtype=pdtype)
    model.train()
    oracle.train()
    before = _snapshot(model)
    converted = impl.convert(model, ctx.process_group(case))
    metrics: list[tuple[str, Metric]] = [(f"convert.{i:02d}", Metric.failure(p))
                                         for i, p in enumerate(conversion_problems(before, converted))]
    converted = converted.to(device)
    data = materialize(case)
    bitwise: dict[int, dict] = {}
    for s in range(len(case.steps)):
        ctx.mark_step(s)
        bitwise[s] = run_step(case, impl, device, ctx.rank, converted, oracle, data.inputs[s],
                                  data.grad_outputs[s], s, metrics)
    result.across = Across(bitwise=bitwise)
    result.metrics = dict(metrics)
