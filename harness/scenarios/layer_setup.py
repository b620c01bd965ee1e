"""How a layer case's module is made ready before its first step (``Case.setup``).

Most cases build the implementation's module, move it to the device and
parameter dtype, and set its weight, bias and running statistics from the
case's data ("copied"). The other setups each reach one way users make a
layer that nn.BatchNorm answers for and SyncBN inherits (or must copy):

- "as-built": the constructor's values kept (the data holds nn.BatchNorm's:
  weight 1, bias 0, running mean 0, variance 1);
- "factory": built in place with ``device=`` and ``dtype=``, never moved after;
  a parameter or buffer elsewhere, or of another dtype, is a problem;
- "stats-off-after": copied, then ``track_running_stats = False``;
- "legacy-state-dict": copied, counted as trained (``LEGACY_COUNT`` steps),
  then given its own state dict back without ``num_batches_tracked`` and
  without version metadata, as a hand-built or old checkpoint has it;
- "meta-assign": built on the meta device, then ``load_state_dict(assign=True)``
  of the case's values without ``num_batches_tracked``.

Each returns problems as ``(metric name, sentence)`` pairs: a load refused,
a layer not made where it was asked for. The oracle follows with the same
data (:mod:`harness.catalog.data`) and, where the buffers are frozen or
counted from before, :func:`harness.judge.oracle.run_oracle`'s flags.
"""

from __future__ import annotations

import torch

from harness.catalog.case import LEGACY_COUNT, Case
from harness.catalog.data import DTYPES

__all__ = ["ready", "set_values"]


def ready(case: Case, impl, group, device: str, data) -> tuple[torch.nn.Module, list[tuple[str, str]]]:
    """The implementation's module for ``case`` on ``device``, made ready as ``case.setup`` says, and its
    problems."""
    pdtype = DTYPES[case.param_dtype]
    problems: list[tuple[str, str]] = []
    if case.setup == "meta-assign":  # as large models are materialized: nothing allocated until the load
        with torch.device("meta"):
            module = impl.build(case, group, device)
        problems += [("layer.load", p) for p in _load(module, data, assign=True)]
    else:
        module = impl.build(case, group, device)
    if case.setup == "factory":  # made in place by device= and dtype=: nothing may move it after
        problems += [("layer.factory", p) for p in _misplaced(module, device, pdtype)]
    else:
        module = module.to(device=device, dtype=pdtype)
    problems += set_values(module, case, data)
    return module, problems


def set_values(module: torch.nn.Module, case: Case, data) -> list[tuple[str, str]]:
    """The case's weight, bias and running statistics in ``module`` where its setup sets them (as built or
    loaded on the meta device, the module keeps its own: the data holds them), then what the setup does after."""
    if case.setup not in ("copied", "stats-off-after", "legacy-state-dict"):
        return []
    with torch.no_grad():
        if case.affine:
            module.weight.copy_(data.weight)
            if case.bias:
                module.bias.copy_(data.bias)
        if case.track_running_stats:
            module.running_mean.copy_(data.running_mean)
            module.running_var.copy_(data.running_var)
    if case.setup == "stats-off-after":
        module.track_running_stats = False
    if case.setup == "legacy-state-dict":  # a layer trained before, given its own values back as an old file has them
        module.num_batches_tracked.fill_(LEGACY_COUNT)
        return [("layer.load", p) for p in _load(module, data)]
    return []


def _load(module: torch.nn.Module, data, assign: bool = False) -> list[str]:
    """``module.load_state_dict`` of its own values (``assign``: the case's) as a hand-built or old state dict
    has them: no num_batches_tracked, no version metadata; what went wrong, if anything."""
    state = {k: v.detach().clone() for k, v in module.state_dict().items() if not k.endswith("num_batches_tracked")}
    if assign:
        values = {"weight": data.weight, "bias": data.bias, "running_mean": data.running_mean,
                  "running_var": data.running_var}
        state = {k: values[k].clone() for k in state if k in values}
    try:
        module.load_state_dict(state, assign=assign)
    except (RuntimeError, TypeError) as exc:
        return [f"load_state_dict({'assign=True' if assign else ''}) of a state dict without num_batches_tracked "
                f"(as nn.BatchNorm loads one): {exc}"]
    return []


def _misplaced(module: torch.nn.Module, device: str, pdtype: torch.dtype) -> list[str]:
    """What of a module built with ``device=`` and ``dtype=`` is not where and what they asked for."""
    want = torch.device(device)
    return [f"built with device={device!r}, dtype={pdtype}, its {name} is {t.dtype} on {t.device}"
            for name, t in [*module.named_parameters(), *module.named_buffers()]
            if t.device.type != want.type or (t.is_floating_point() and t.dtype != pdtype)]
