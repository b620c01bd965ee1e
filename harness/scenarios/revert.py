"""The revert scenario: a converted model trained one step, turned back into BatchNorm by the implementation's own
revert, judged as the BatchNorm model it must be.

Users convert to SyncBN for training and go back to BatchNorm for inference on
one process (Lightning's ``TorchSyncBatchNorm.revert`` at a strategy's
teardown, mmengine's ``revert_sync_batchnorm``; torch has none, pytorch#41081).
Per rank: build the case's model (:mod:`harness.scenarios.user_models`),
convert it (``Impl.convert``, checked as the conversion scenario checks it),
run step 0 (a synchronized training step over the global batch, judged as in
:mod:`harness.scenarios.conversion`), then revert it (``Impl.revert``) and
check, before anything runs again:

- every layer that was a BatchNorm is a BatchNorm that computes what its
  class did (its class's ``forward``), and none is a SyncBatchNorm; every
  other module is of the class it was;
- each such layer's configuration: eps, momentum, affine,
  track_running_stats, and a bias exactly where it had one (``bias=False``);
- every module's ``training`` flag and every parameter's ``requires_grad``
  as they were (a frozen layer stays in eval mode and frozen);
- every parameter and buffer (running statistics, ``num_batches_tracked``)
  bitwise what the converted model held, and none added or lost.

Then the later steps run the reverted model on this rank's own batch alone
(a layer that still synchronizes normalizes over every rank's batch and
fails there too), the model's own ``eval()`` or
``train()`` first, beside the float64 unconverted model (trained on the
global batch in step 0) on the same batch: outputs, the input gradient, the
parameter gradients and the buffers must be ``nn.BatchNorm``'s. Across ranks
(in the parent), the buffers must be bitwise the same after step 0 and after
an eval step (a training step on a rank's own batch moves each rank's apart).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from harness.catalog.case import STEP_KINDS, Case
from harness.catalog.data import DTYPES, materialize
from harness.judge.metric import Metric
from harness.scenarios import user_models
from harness.scenarios.across import Across
from harness.scenarios.conversion import _every, _snapshot, conversion_problems, run_step
from harness.scenarios.model import judge_across

__all__ = ["run_rank", "judge_across", "unsupported_reason", "revert_problems", "before_revert"]

CONFIG = ("eps", "momentum", "affine", "track_running_stats")


def unsupported_reason(case: Case, impl, device: str, backend: str) -> Optional[str]:
    """Step 0 is synchronized over the whole world (no subgroups); the model must be buildable here."""
    if case.groups:
        return "a revert case trains over the whole world (no process subgroups)"
    return user_models.unbuildable(case.model)


def before_revert(model: nn.Module, norms: dict) -> dict:
    """What a faithful revert keeps, read from the converted ``model`` just before it is reverted; ``norms``:
    the class each BatchNorm had before conversion, by every name it has (``_snapshot(plain)["norms"]``)."""
    modules = dict(model.named_modules(remove_duplicate=False))
    return {
        "norms": dict(norms),
        "kinds": {n: type(m) for n, m in modules.items()},
        "config": {n: {**{k: getattr(m, k) for k in CONFIG}, "bias": m.bias is not None}
                   for n, m in modules.items() if n in norms and isinstance(m, _BatchNorm)},
        "training": {n: m.training for n, m in modules.items()},
        "params": {n: (p.detach().clone(), p.requires_grad) for n, p in _every(model, "_parameters")},
        "buffers": {n: b.detach().clone() for n, b in _every(model, "_buffers")},
    }


def revert_problems(before: dict, reverted: nn.Module) -> list[str]:
    """What the revert changed or left that a BatchNorm model would not have, one sentence each."""
    problems = []
    modules = dict(reverted.named_modules(remove_duplicate=False))
    for name, kind in before["norms"].items():
        got = modules.get(name)
        if got is None:
            problems.append(f"{name} is missing after revert")
        elif isinstance(got, nn.SyncBatchNorm) or not isinstance(got, _BatchNorm):
            problems.append(f"{name} is {type(got).__name__} after revert, not a BatchNorm")
        elif kind is not None and type(got).forward is not kind.forward:
            problems.append(f"{name} is {type(got).__name__} after revert, whose forward is not {kind.__name__}'s "
                            "(it still synchronizes, or lost what its class did)")
    for name, kind in before["kinds"].items():
        got = modules.get(name)
        if name not in before["norms"] and got is not None and type(got) is not kind:
            problems.append(f"{name or 'the model'} is {type(got).__name__} after revert, was {kind.__name__}")
    for name, config in before["config"].items():
        got = modules.get(name)
        if isinstance(got, _BatchNorm):
            now = {**{k: getattr(got, k, None) for k in CONFIG}, "bias": getattr(got, "bias", None) is not None}
            problems += [f"{name}: {k}={now[k]} after revert, was {v}" for k, v in config.items() if now[k] != v]
    for name, flag in before["training"].items():
        if name in modules and modules[name].training != flag:
            problems.append(f"{name or 'the model'}: training={modules[name].training} after revert, was {flag}")
    problems += _tensor_problems(before["params"], dict(_every(reverted, "_parameters")), "parameter")
    problems += _tensor_problems({n: (t, None) for n, t in before["buffers"].items()},
                                 dict(_every(reverted, "_buffers")), "buffer")
    return problems


def _tensor_problems(before: dict, after: dict, what: str) -> list[str]:
    """Tensors lost, added, changed in value or in ``requires_grad`` (``None``: not asked) by the revert."""
    problems = [f"{what} {n} is missing after revert" for n in before if n not in after]
    problems += [f"{what} {n} appeared in the revert" for n in after if n not in before]
    for name, (value, requires_grad) in before.items():
        got = after.get(name)
        if got is None:
            continue
        if got.dtype != value.dtype or got.shape != value.shape or not torch.equal(got.detach().cpu(), value.cpu()):
            problems.append(f"{what} {name} changed in the revert")
        if requires_grad is not None and got.requires_grad != requires_grad:
            problems.append(f"{what} {name}: requires_grad={got.requires_grad} after revert, was {requires_grad}")
    return problems


def run_rank(ctx, case: Case, impl, device: str, result, compare_with: Optional[str] = None) -> None:
    """Convert, train step 0 over the world, revert, check the reverted model, run the later steps alone."""
    rank = ctx.rank
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
    ctx.mark_step(0)
    bitwise = {0: run_step(case, impl, device, rank, converted, oracle, data.inputs[0], data.grad_outputs[0], 0,
                           metrics)}
    kept = before_revert(converted, before["norms"])
    reverted = impl.revert(converted)
    metrics += [(f"reverted.{i:02d}", Metric.failure(p)) for i, p in enumerate(revert_problems(kept, reverted))]
    for s in range(1, len(case.steps)):
        ctx.mark_step(s)
        own = run_step(case, impl, device, rank, reverted, oracle, [data.inputs[s][rank]],
                       [data.grad_outputs[s][rank]], s, metrics, ranks=[rank])
        if STEP_KINDS[case.steps[s]] == "eval":
            bitwise[s] = own
    ctx.mark_step(None)
    result.across = Across(bitwise=bitwise)
    result.metrics = dict(metrics)

