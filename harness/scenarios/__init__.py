"""Scenarios: what a rank does with a case, by kind (``Case.scenario``).

A scenario module has two functions:
- ``run_rank(ctx, case, impl, device, result, compare_with)``: on one rank,
  build what the case says with the implementation, run its steps, judge this
  rank's tensors against the float64 oracle, and fill the
  :class:`~harness.engine.messages.RankResult` (metrics, and in ``across`` what
  the parent needs to judge the ranks together);
- ``judge_across(case, results)``: in the parent, the checks that need every
  rank's result (sums of per-rank shares, invariants across ranks), as
  ``(name, Metric)`` pairs.

An optional third, ``unsupported_reason(case, impl, device)``, says why a
build cannot run a case at all (the record is then ``unsupported``).

- :mod:`~harness.scenarios.layer`: one SyncBN layer (or a converted nested model's layer), step by step;
- :mod:`~harness.scenarios.model`: SyncBN inside a small network, optionally under DDP and an optimizer
  (the networks and their float64 oracle in :mod:`~harness.scenarios.networks`).
"""

import importlib

SCENARIOS = ("layer", "model")


def module(name: str):
    """The scenario module called ``name``."""
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}: one of {', '.join(SCENARIOS)}")
    return importlib.import_module(f"harness.scenarios.{name}")
