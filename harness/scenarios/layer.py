"""The layer scenario: one SyncBN layer per rank, driven step by step, judged tensor by tensor.

Per rank: regenerate the case's inputs from its seed, compute the float64
oracle, build the implementation's module (or convert a nested model of plain
BatchNorms and take its layer, ``case.model == "nested"``), run each step and
compare the output, grad_input, grad_weight and grad_bias shares, running
statistics and num_batches_tracked of every step with the oracle (a case
without bias, ``Case.bias`` False: no grad_bias, and the layer must have
none). Steps
(``Case.steps``): ``train`` and ``eval`` (forward, then backward with the
case's upstream gradient); ``fwd`` (a training forward whose backward comes
with the next ``train`` step: two forwards, one backward of both, as a GAN
discriminator does); ``nograd`` (a training forward under
``torch.no_grad()``); ``eval-rank0`` (rank 0 alone evaluates while the others
wait: no collective is allowed there, and one raises at once instead of
hanging the peers). The input may be a view dense in no memory format
(``Case.input_layout``: permuted or sliced); whatever it is, forward must
leave it bitwise untouched and return an output that does not alias it.
Every collective the implementation issues is recorded per step (the checks
on them are :mod:`harness.judge.desync`'s, for every scenario).

Across ranks (in the parent): the sum over ranks of the grad_weight and
grad_bias shares against the oracle's sum (what DDP will use), and every
group's running statistics and num_batches_tracked, which must be bitwise the
same on every rank.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from functools import partial
from typing import Optional

import torch

from harness.catalog.case import STEP_KINDS, Case, evaluates
from harness.catalog.data import DTYPES
from harness.judge.budget import sum_tolerance_of
from harness.judge.compare import judge_rank, judge_sums
from harness.judge.invariants import bits
from harness.judge.metric import Metric
from harness.judge.metric_key import step_key
from harness.judge.oracle import ONE_VALUE
from harness.scenarios import layer_setup, prepared
from harness.scenarios.across import Across, judge_bitwise, of_results

TENSORS = ("output", "grad_input", "grad_weight", "grad_bias", "running_mean", "running_var")
BUFFERS = ("running_mean", "running_var", "num_batches_tracked")


def run_rank(ctx, case: Case, impl, device: str, result, compare_with: Optional[str] = None) -> None:
    """Run ``case`` with ``impl`` on this rank and fill ``result`` (metrics, what the parent judges across ranks)."""
    rank = ctx.rank
    seed_generators(case.seed, device)
    # read-only: kept for the next implementation of this case
    data, truths = prepared.prepare(case, rank, getattr(ctx, "exchange", None))
    group = ctx.process_group(case)
    refuse_at = len(truths) - 1 if truths and truths[-1].raises else None
    observed, problems = run_steps(ctx, case, impl, device, data, group, refuse_at=refuse_at)
    refusal = observed.pop() if refuse_at is not None and len(observed) > refuse_at else None
    truths = truths[:len(observed)]
    result.across = Across(bitwise={s: {name: obs[f"{name}_bits"] for name in BUFFERS}
                                    for s, obs in enumerate(observed) if obs is not None})
    budgets: dict = {}
    metrics = judge_rank(case, rank, data, truths, observed, budgets=budgets)
    if case.affine:
        judged = {s: obs.get("grad_steps") or [s] for s, obs in enumerate(observed)
                  if obs is not None and obs.get("grads", "own") in ("own", "accumulated")}
        result.across.shares = {str(s): {which: _as_list(observed[s][which], case.channels)
                                         for which in parameter_grads(case)} for s in judged}
        # Each rank's budget terms of the sums' tolerance: the parent adds them up (judge_across), so no rank
        # goes over the others' tensors again.
        result.across.budgets = budgets
        # This rank's true shares: the parent sums them over the ranks (a rank may hold only its own truth).
        result.across.true_shares = {
            str(s): {which: {str(i): getattr(truths[i], which)[rank].tolist() for i in steps}
                     for which in parameter_grads(case)}
            for s, steps in judged.items()}
    if compare_with:
        result.compare = compare_implementations(ctx, case, compare_with, device, data, group, observed)
    metrics += [(name, Metric.failure(p)) for name, p in problems]
    if refusal is not None:
        metrics.append((step_key(refuse_at, "train", "refused"), _refusal_metric(refusal, ONE_VALUE)))
    for s, obs in enumerate(observed):
        if obs is None:
            continue
        key = partial(step_key, s, STEP_KINDS[case.steps[s]])
        metrics += [(key("input"), Metric.failure(p)) for p in obs["input_problems"]]
    result.metrics = dict(metrics)


def parameter_grads(case: Case) -> tuple[str, ...]:
    """The parameter gradients an affine layer of ``case`` has: no grad_bias without a bias (``bias=False``)."""
    return ("grad_weight", "grad_bias") if case.bias else ("grad_weight",)


def seed_generators(seed: int, device: str) -> None:
    """Seed the generators an implementation may draw from on ``device`` (CPU's alone on CPU).

    ``torch.manual_seed`` also queues the seed for every device type not yet initialized (CUDA, XPU, MTIA),
    formatting a stack trace for each and keeping it until that device starts: a few milliseconds a task and a
    queue that grows with every task in a CPU rank.
    """
    if device == "cpu":
        torch.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)


def _refusal_metric(refusal: dict, expected: str) -> Metric:
    """A step nn.BatchNorm refuses over the global batch: the implementation must raise too."""
    if refusal["raised"]:
        return Metric.passed()
    var = refusal.get("running_var")
    after = f"; running_var afterwards {var}" if var is not None else ""
    return Metric.failure(f"accepted a training step with one value per channel in the whole group, where "
                          f"nn.BatchNorm over the same batch raises ValueError ({expected!r}){after}")


def judge_across(case: Case, results: list) -> list[tuple[str, Metric]]:
    """The grad shares' sums against the oracle's, and the buffers that must be bitwise equal on every rank."""
    out = judge_bitwise(case, of_results(results), BUFFERS)
    if not case.affine or len(results) != case.world_size:
        return out
    sum_truth = _sum_truth(sorted(results, key=lambda r: r.rank))
    if sum_truth and all(r.across.shares is not None and r.across.budgets is not None for r in results):
        ranked = [r.across.budgets for r in sorted(results, key=lambda r: r.rank)]
        final = {s: {which: {"true": t["true"],
                             "tol": sum(sum_tolerance_of(case, ranked, abs_true, i, which)
                                        for i, abs_true in t["abs_true"].items()).tolist()}
                     for which, t in by_which.items()}
                 for s, by_which in sum_truth.items()}
        out += judge_sums(final, [r.across.shares for r in results])
    return out



def _sum_truth(ranked: list) -> Optional[dict]:
    """The true sums over the ranks of the gradient shares, from each rank's own true shares (in rank order, as
    the oracle sums them): ``{step: {which: {"true": [...], "abs_true": {inner step: [...]}}}}`` for the steps
    every rank judged, or None when a rank sent none."""
    shares = [r.across.true_shares for r in ranked]
    if not shares or any(t is None for t in shares):
        return None
    out: dict = {}
    for s, by_which in shares[0].items():
        if any(s not in t for t in shares):
            continue  # a step some rank did not judge (evaluation on one rank): judge_sums skips it too
        out[s] = {}
        for which, by_step in by_which.items():
            sums = {i: torch.stack([torch.tensor(t[s][which][i], dtype=torch.float64) for t in shares]).sum(0)
                    for i in by_step}
            out[s][which] = {"true": sum(sums[i] for i in by_step).tolist(),
                             "abs_true": {i: v.abs().tolist() for i, v in sums.items()}}
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


def _storage(t: torch.Tensor) -> int:
    """Where ``t``'s memory starts (``untyped_storage`` is torch >= 2.0; ``storage`` before, deprecated since)."""
    return (t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()).data_ptr()


def _input_problems(x: torch.Tensor, before: torch.Tensor, y: torch.Tensor) -> list[str]:
    problems = []
    if not torch.equal(x.detach(), before) and not (x.isnan().any() and before.isnan().any()):
        problems.append("forward changed its input (the input tensor must be left as it was)")
    if y.numel() and x.numel() and _storage(y) == _storage(x):
        problems.append("the output aliases the input's memory (a later write to one changes the other)")
    return problems


def run_steps(ctx, case: Case, impl, device: str, data, group, refuse_at: Optional[int] = None
              ) -> tuple[list, list[str]]:
    """Build this rank's module (or convert the nested model), run every step, return what it produced and the
    problems of the module itself, as ``(metric name, sentence)`` pairs (what conversion changed; a bias the
    case has none of).

    ``observed[s]`` is None for a step this rank takes no part in. At step ``refuse_at`` (one the oracle
    refuses) only the forward runs, inside ``try``, and the steps end: its entry is ``{"raised": message or
    None, "running_var": ...}``. ``ctx`` is the rank's context: its rank,
    and the marks that tell the collective recorder which step a call belongs to.
    """
    rank = ctx.rank
    pdtype = DTYPES[case.param_dtype]
    problems: list[tuple[str, str]] = []
    if case.model == "nested":
        module, converted = convert_nested(case, impl, group)
        problems += [(f"convert.{i}", p) for i, p in enumerate(converted)]
        module = module.to(device=device, dtype=pdtype)
        problems += layer_setup.set_values(module, case, data)
    else:
        module, made = layer_setup.ready(case, impl, group, device, data)
        problems += made
    has_bias = getattr(module, "bias", None) is not None
    if case.affine and not case.bias and has_bias:
        problems.append(("layer.bias", "built with bias=False, the layer has a bias all the same (nn.BatchNorm's "
                                       "is None); it is left as the layer made it"))
    observed: list = []
    pending: list = []  # forwards ("fwd" steps) whose backward comes with the next train step
    for s, kind in enumerate(case.steps):
        ctx.mark_step(s)
        if not evaluates(kind, rank, case.world_size):
            observed.append(None)
            continue
        module.train(STEP_KINDS[kind] == "train")
        x, leaf = present(data.inputs[s][rank], case.input_layout, device)
        before = x.detach().clone()
        dy = data.grad_outputs[s][rank].to(device, copy=True)  # the case's own stays as it was
        if s == refuse_at:
            observed.append(_try_refused(impl, module, x, case))
            break
        alone = not all(evaluates(kind, r, case.world_size) for r in range(case.world_size))
        with ctx.forbid_collectives("evaluation on some ranks alone") if alone else contextlib.nullcontext():
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
        obs["grad_bias"] = _cpu(getattr(module.bias, "grad", None)) if case.affine and has_bias else None
        for name in ("running_mean", "running_var"):
            obs[name] = _cpu(getattr(module, name)) if case.track_running_stats else None
        obs["num_batches_tracked"] = int(module.num_batches_tracked) if case.track_running_stats else None
        for name in BUFFERS:
            obs[f"{name}_bits"] = bits(getattr(module, name, None)) if case.track_running_stats else None
        observed.append(obs)
        if kind != "fwd":
            module.zero_grad(set_to_none=True)
    ctx.mark_step(None)
    return observed, problems


def _try_refused(impl, module, x: torch.Tensor, case: Case) -> dict:
    """The forward of a step nn.BatchNorm refuses: what the implementation raised, or what it left behind."""
    try:
        impl.forward(module, x)
    except (ValueError, RuntimeError) as e:
        return {"raised": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    var = getattr(module, "running_var", None) if case.track_running_stats else None
    return {"raised": None, "running_var": None if var is None else [float(v) for v in var.detach().cpu()]}


def compare_implementations(ctx, case: Case, other_name: str, device: str, data, group, observed) -> dict:
    """Run another implementation on the same inputs on this rank; the largest difference per tensor and step."""
    other = ctx.impl(other_name, device)
    out: dict = {"with": other.name, "max_abs_diff": {}, "error": None}
    reason = other.unsupported_reason(case, device)
    if reason:
        out["error"] = f"unsupported: {reason}"
        return out
    theirs, _ = run_steps(ctx, case, other, device, data, group)
    for s, (a, b) in enumerate(zip(observed, theirs)):
        if a is None or b is None:
            continue
        for name in TENSORS:
            ta, tb = a.get(name), b.get(name)
            if ta is None or tb is None or ta.shape != tb.shape:
                continue
            diff = (ta.double() - tb.double()).abs()
            out["max_abs_diff"][step_key(s, case.steps[s], name)] = float(diff.max()) if diff.numel() else 0.0
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
    return t.double().reshape(-1).tolist()
