"""What a rank does with one task: build the module, run the steps, judge.

Protocol: :func:`run_task` takes a task (plain dict: ``case``, ``impl``,
``device``) and returns a plain dict, never a tensor or an exception object:

    {"rank", "status": "pass" | "mismatch" | "error", "message",
     "exception_type", "traceback", "metrics": {tensor name: metric dict},
     "shares": {step: {"grad_weight": [...], "grad_bias": [...]}},
     "sum_truth": {step: {"grad_weight": {"true": [...], "tol": [...]}, ...}}  (rank 0)
     "impl_version", "mode", "duration_s"}

Every rank regenerates the case's inputs from its seed and computes the
float64 oracle itself, so nothing but names and numbers crosses processes.
Each rank judges its own tensors; the parent judges the sums of the
grad_weight/grad_bias shares over ranks (:func:`judge_sums`).
"""

from __future__ import annotations

import math
import time
import traceback
from collections import OrderedDict
from typing import Optional

import torch

from harness import compare
from harness.case import DTYPES, Case, materialize
from harness.impls import Impl, resolve
from harness.oracle import run_oracle


class RankContext:
    """Per-process state kept between tasks: adapters already set up, subgroups already made."""

    def __init__(self, rank: int, world_size: int):
        self.rank = rank
        self.world_size = world_size
        self._impls: dict[str, Impl] = {}
        self._groups: dict[tuple, list] = {}

    def impl(self, key: str, device: str) -> Impl:
        if key not in self._impls:
            impl = resolve(key)
            impl.setup_rank(device)
            self._impls[key] = impl
        return self._impls[key]

    def process_group(self, case: Case):
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


def run_task(ctx: RankContext, task: dict) -> dict:
    """Run one (case, impl) on this rank and judge it; never raises."""
    t0 = time.perf_counter()
    result: dict = {"rank": ctx.rank, "status": "error", "message": "", "exception_type": None,
                    "traceback": None, "metrics": {}, "shares": {}, "sum_truth": {}}
    try:
        case = Case.from_dict(task["case"])
        device = task.get("device", "cpu")
        impl = ctx.impl(task["impl"], device)
        result["impl_version"] = impl.version()
        result["mode"] = impl.mode
        _execute(ctx, case, impl, device, result, task.get("compare"))
    except BaseException as exc:  # noqa: BLE001 - a rank reports every failure as data
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        result.update(status="error", exception_type=type(exc).__name__, message=str(exc)[:2000],
                      traceback=traceback.format_exc()[-8000:])
    result["duration_s"] = time.perf_counter() - t0
    return result


def _execute(ctx: RankContext, case: Case, impl: Impl, device: str, result: dict,
             task_compare: Optional[str] = None) -> None:
    rank = ctx.rank
    torch.manual_seed(case.seed)
    data = materialize(case)
    truths = run_oracle(
        data.inputs, data.grad_outputs, case.steps, num_features=case.channels, eps=case.eps,
        momentum=case.momentum, affine=case.affine, track_running_stats=case.track_running_stats,
        weight=data.weight, bias=data.bias, param_dtype=DTYPES[case.param_dtype],
        running_mean=data.running_mean, running_var=data.running_var, groups=case.groups)
    group = ctx.process_group(case)
    observed, convert_problems = _run_steps(ctx, case, impl, device, data, group)
    for s, obs in enumerate(observed):
        if case.affine:
            result["shares"][str(s)] = {"grad_weight": _as_list(obs["grad_weight"], case.channels),
                                        "grad_bias": _as_list(obs["grad_bias"], case.channels)}
            if rank == 0:
                result["sum_truth"][str(s)] = {
                    which: {"true": getattr(truths[s], f"{which}_sum").tolist(),
                            "tol": (compare.K * compare.sum_budget(case, data, truths, s, which)).tolist()}
                    for which in ("grad_weight", "grad_bias")}
    if task_compare:
        result["compare"] = _compare_with(ctx, case, ctx.impl(task_compare, device), device, data, group, observed)
    metrics = compare.judge_rank(case, rank, data, truths, observed)
    metrics += [(f"convert.{i}", compare.Metric("convert", math.inf, math.inf, 0.0, math.inf, p))
                for i, p in enumerate(convert_problems)]
    result["metrics"] = {name: m.to_dict() for name, m in metrics}
    bad = [(name, m) for name, m in metrics if not m.ok]
    if bad:
        result["status"] = "mismatch"
        result["message"] = "; ".join(_describe(name, m) for name, m in bad[:4]) + (
            f" (+{len(bad) - 4} more)" if len(bad) > 4 else "")
    else:
        result["status"] = "pass"


def _run_steps(ctx: RankContext, case: Case, impl: Impl, device: str, data, group) -> tuple[list[dict], list[str]]:
    """Build this rank's module (or convert the nested model), run every step, return what it produced."""
    rank = ctx.rank
    pdtype = DTYPES[case.param_dtype]
    convert_problems: list[str] = []
    if case.model == "nested":
        module, convert_problems = convert_nested(case, impl, group, device)
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


def _compare_with(ctx: RankContext, case: Case, other: Impl, device: str, data, group, observed) -> dict:
    """Run ``other`` on the same inputs on this rank; the largest difference per tensor and step."""
    out: dict = {"with": other.name, "max_abs_diff": {}, "error": None}
    reason = other.unsupported_reason(case, device)
    if reason:
        out["error"] = f"unsupported: {reason}"
        return out
    theirs, _ = _run_steps(ctx, case, other, device, data, group)
    for s, (a, b) in enumerate(zip(observed, theirs)):
        for name in ("output", "grad_input", "grad_weight", "grad_bias", "running_mean", "running_var"):
            ta, tb = a[name], b[name]
            if ta is None or tb is None or ta.shape != tb.shape:
                continue
            diff = (ta.double() - tb.double()).abs()
            out["max_abs_diff"][f"step{s}.{case.steps[s]}.{name}"] = float(diff.max()) if diff.numel() else 0.0
    return out


BATCHNORM_BY_NDIM = {2: "BatchNorm1d", 3: "BatchNorm1d", 4: "BatchNorm2d", 5: "BatchNorm3d"}


def convert_nested(case: Case, impl: Impl, group, device: str):
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
    for n, flag in training.items():
        if n and dict(converted.named_modules()).get(n) is not None:
            if dict(converted.named_modules())[n].training != flag:
                problems.append(f"module {n}: training {not flag}, was {flag}")
    return converted.get_submodule("layer"), problems


def _cpu(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.detach().cpu().clone()


def _as_list(t: Optional[torch.Tensor], n: int) -> list:
    if t is None:
        return [0.0] * n
    return [float(v) for v in t.double().reshape(-1)]


def _describe(name: str, m: compare.Metric) -> str:
    if m.problem:
        return f"{name}: {m.problem}"
    return f"{name}: max abs err {m.max_abs_err:.3g} > tol {m.tol:.3g} ({m.ratio:.3g}x)"


def judge_sums(results: list[dict]) -> tuple[dict, list[str]]:
    """Compare the sum over ranks of grad_weight/grad_bias shares with the oracle's sum."""
    metrics, problems = {}, []
    truth_by_step = next((r.get("sum_truth") for r in results if r.get("sum_truth")), None)
    if not truth_by_step:
        return metrics, problems
    for step, truth in truth_by_step.items():
        for which, t in truth.items():
            shares = [r["shares"][step][which] for r in results if step in r.get("shares", {})]
            if len(shares) != len(results):
                continue
            got = torch.tensor(shares, dtype=torch.float64).sum(0)
            true = torch.tensor(t["true"], dtype=torch.float64)
            tol = torch.tensor(t["tol"], dtype=torch.float64)
            m = compare.compare_tensor(f"{which}_sum", got, true, tol / compare.K)
            name = f"step{step}.{which}_sum"
            metrics[name] = m.to_dict()
            if not m.ok:
                problems.append(_describe(name, m))
    return metrics, problems
