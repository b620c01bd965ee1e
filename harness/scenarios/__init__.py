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

- :mod:`~harness.scenarios.layer`: one SyncBN layer (or a converted nested model's layer), step by step.
"""

import importlib

SCENARIOS = ("layer",)


def module(name: str):
    """The scenario module called ``name``."""
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}: one of {', '.join(SCENARIOS)}")
    return importlib.import_module(f"harness.scenarios.{name}")
