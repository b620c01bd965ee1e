"""Scenarios: what a rank does with a case, by kind (``Case.scenario``).

A scenario module has two functions:
- ``run_rank(ctx, case, impl, device, result, compare_with)``: on one rank,
  build what the case says with the implementation, run its steps, judge this
  rank's tensors against the float64 oracle, and fill the
  :class:`~harness.engine.messages.RankResult` (metrics, and in ``across`` an
  :class:`~harness.scenarios.across.Across`: what the parent needs to judge the
  ranks together);
- ``judge_across(case, results)``: in the parent, the checks that need every
  rank's result (sums of per-rank shares, invariants across ranks), as
  ``(name, Metric)`` pairs.
and may have a third, asked in the parent before any rank runs the case:
- ``unsupported_reason(case, impl, device, backend)``: why the scenario cannot
  run here (a device, a backend, an implementation it needs), or None; such
  records are ``unsupported`` with that reason (:func:`unsupported_reason`).

- :mod:`~harness.scenarios.layer`: one SyncBN layer (or a converted nested model's layer), step by step, made ready
  as the case's setup says (:mod:`~harness.scenarios.layer_setup`: copied values, as built, in place, loaded);
- :mod:`~harness.scenarios.model`: SyncBN inside a small network, optionally under DDP or FSDP2 and an optimizer
  (the networks in :mod:`~harness.scenarios.networks`, their float64 side stepped in lockstep in
  :mod:`~harness.scenarios.network_oracle`, FSDP2's sharding in :mod:`~harness.scenarios.sharded`);
- :mod:`~harness.scenarios.conversion`: a user's model converted by the implementation, judged by the unconverted
  model in float64 (the models in :mod:`~harness.scenarios.user_models`);
- :mod:`~harness.scenarios.checkpoint`: a converted model's checkpoint resumed at another world size, reverted to
  plain BatchNorm, or loaded on rank 0 under DDP;
- :mod:`~harness.scenarios.revert`: a converted model trained a step, reverted to BatchNorm by the implementation's
  own revert, judged as the BatchNorm model it must be;
- :mod:`~harness.scenarios.cuda_graph`: a training step captured in a CUDA graph, replayed step by step;
- :mod:`~harness.scenarios.private_ops`: one of torch's five private SyncBN ops on fixed inputs, output by output
  against its float64 contract (:mod:`harness.judge.private_ops`);
- :mod:`~harness.scenarios.inference`: a converted model trained on the ranks (or in a process without a process
  group), then evaluated, traced and exported on CPU with its layers as shipped;
- :mod:`~harness.scenarios.uses`: what users do around the model scenario's network (activation checkpointing,
  a gradient penalty, autocast, autocast with a GradScaler, TorchScript, DDP's join), a ``Use`` class each;
- :mod:`~harness.scenarios.across`: what a rank sends for the checks across ranks, and the bitwise check they
  share;
- :mod:`~harness.scenarios.prepared`: a rank's inputs and truths of a case, kept for the next implementation.
"""

import importlib
import sys
from typing import Optional

SCENARIOS = ("layer", "model", "conversion", "checkpoint", "cuda_graph", "revert", "private_ops", "inference")


def module(name: str):
    """The scenario module called ``name``."""
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}: one of {', '.join(SCENARIOS)}")
    return importlib.import_module(f"harness.scenarios.{name}")


def unsupported_reason(case, impl, device: str, backend: str) -> Optional[str]:
    """Why the case's scenario cannot run ``impl`` on ``device`` over ``backend``, or None (most scenarios: None)."""
    if case.compile:
        import torch

        if not hasattr(torch, "compile"):
            return f"torch {torch.__version__} has no torch.compile (torch >= 2.0)"
        if sys.version_info >= (3, 11) and torch.__version__.startswith("2.0."):
            return (f"torch {torch.__version__}'s torch.compile does not run on Python "
                    f"{sys.version_info.major}.{sys.version_info.minor} (torch >= 2.1 does)")
    check = getattr(module(case.scenario), "unsupported_reason", None)
    return check(case, impl, device, backend) if check is not None else None
