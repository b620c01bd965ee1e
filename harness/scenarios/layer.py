"""The layer scenario: one SyncBN layer per rank, driven step by step, judged tensor by tensor.

Per rank: regenerate the case's inputs from its seed, compute the float64
oracle, build the implementation's module (or convert a nested model of plain
BatchNorms and take its layer, ``case.model == "nested"``), run each step
(train or eval: forward, backward with the case's upstream gradient), and
compare the output, grad_input, grad_weight and grad_bias shares, running
statistics and num_batches_tracked of every step with the oracle.

Across ranks (in the parent): the sum over ranks of the grad_weight and
grad_bias shares against the oracle's sum, which is what DDP will use.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Optional

import torch

from harness.catalog.case import DTYPES, Case, materialize
from harness.judge.compare import judge_rank, judge_sums, sum_tolerance
from harness.judge.metric import Metric
from harness.judge.oracle import run_oracle

TENSORS = ("output", "grad_input", "grad_weight", "grad_bias", "running_mean", "running_var")


def run_rank(ctx, case: Case, impl, device: str, result, compare_with: Optional[str] = None) -> None:
    """Run ``case`` with ``impl`` on this rank and fill ``result`` (metrics, grad shares, comparison)."""
    rank = ctx.rank
    torch.manual_seed(case.seed)
    data = materialize(case)
    truths = run_oracle(
        data.inputs, data.grad_outputs, case.steps, num_features=case.channels, eps=case.eps,
        momentum=case.momentum, affine=case.affine, track_running_stats=case.track_running_stats,
        weight=data.weight, bias=data.bias, param_dtype=DTYPES[case.param_dtype],
        running_mean=data.running_mean, running_var=data.running_var, groups=case.groups)
    group = ctx.process_group(case)
    observed, convert_problems = run_steps(case, impl, device, rank, data, group)
    if case.affine:
        result.across["shares"] = {str(s): {which: _as_list(obs[which], case.channels)
                                            for which in ("grad_weight", "grad_bias")}
                                   for s, obs in enumerate(observed)}
        if rank == 0:
            result.across["sum_truth"] = {
                str(s): {which: {"true": getattr(truths[s], f"{which}_sum").tolist(),
                                 "tol": sum_tolerance(case, data, truths, s, which).tolist()}
                         for which in ("grad_weight", "grad_bias")}
                for s in range(len(observed))}
    if compare_with:
        result.compare = compare_implementations(ctx, case, compare_with, device, data, group, observed)
    metrics = judge_rank(case, rank, data, truths, observed)
    metrics += [(f"convert.{i}", Metric.failure(p)) for i, p in enumerate(convert_problems)]
    result.metrics = dict(metrics)


def judge_across(case: Case, results: list) -> list[tuple[str, Metric]]:
    """The sums over ranks of the grad_weight/grad_bias shares against the oracle's sums."""
    if not case.affine or len(results) != case.world_size:
        return []
    sum_truth = next((r.across.get("sum_truth") for r in results if r.across.get("sum_truth")), None)
    if not sum_truth or not all("shares" in r.across for r in results):
        return []
    return judge_sums(sum_truth, [r.across["shares"] for r in results])


def run_steps(case: Case, impl, device: str, rank: int, data, group) -> tuple[list[dict], list[str]]:
    """Build this rank's module (or convert the nested model), run every step, return what it produced."""
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
    observed = []
    for s, kind in enumerate(case.steps):
        module.train(kind == "train")
        x = data.inputs[s][rank].to(device).detach().clone().requires_grad_(True)
        dy = data.grad_outputs[s][rank].to(device)
        y = impl.forward(module, x)
        y.backward(dy)
        observed.append({
            "output": y.detach().cpu(),
            "grad_input": _cpu(x.grad),
            "grad_weight": _cpu(getattr(module.weight, "grad", None)) if case.affine else None,
            "grad_bias": _cpu(getattr(module.bias, "grad", None)) if case.affine else None,
            "running_mean": _cpu(module.running_mean) if case.track_running_stats else None,
            "running_var": _cpu(module.running_var) if case.track_running_stats else None,
            "num_batches_tracked": int(module.num_batches_tracked) if case.track_running_stats else None,
        })
        module.zero_grad(set_to_none=True)
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
