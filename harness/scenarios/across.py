"""What a rank sends for the checks across ranks (:class:`Across`), and the bitwise check every scenario shares.

A rank judges its own tensors against the float64 oracle; some checks need
every rank at once and run in the parent, after the ranks answered: the
tensors that must be bitwise the same on every rank of a group (running
statistics and ``num_batches_tracked``; under DDP the averaged gradients, the
parameters and the optimizer state), and the sum over ranks of the
grad_weight/grad_bias shares. :class:`Across` is what a rank sends for them,
inside its :class:`~harness.engine.messages.RankResult`; it crosses process
boundaries as plain data (:meth:`Across.to_dict` / :meth:`Across.from_dict`,
over a pipe or as JSON, where the steps' integer keys become strings and come
back as integers).

The sums' data (``shares``, ``budgets``, ``true_shares``, ``sum_truth``) keep
the step-keyed layout :func:`harness.judge.compare.judge_sums` and
:func:`~harness.judge.budget.sum_tolerance_of` read. :func:`judge_bitwise`
is the one loop over steps, tensors and groups that every scenario's
``judge_across`` runs over ``bitwise``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from harness.catalog.case import STEP_KINDS, Case
from harness.judge.invariants import compare_across
from harness.judge.metric import Metric
from harness.judge.metric_key import step_key


@dataclass
class Across:
    """One rank's data for the checks across ranks (every field optional: a scenario fills what it checks).

    ``bitwise``: ``{step: {tensor name: harness.judge.invariants.bits(tensor)}}``, the tensors that must be
    bitwise equal on every rank of a group after that step. ``shares``: ``{str(step): {"grad_weight" |
    "grad_bias": [floats]}}``, this rank's gradient shares, summed over the ranks in the parent.
    ``budgets`` and ``true_shares``: this rank's terms of the sums' tolerance and its true shares
    (the layer scenario, whose ranks each hold their own truth); ``sum_truth``: the sums' truth and tolerance,
    sent by one rank (the CUDA graph scenario).
    """

    bitwise: dict[int, dict[str, Optional[dict]]] = field(default_factory=dict)
    shares: Optional[dict] = None
    budgets: Optional[dict] = None
    true_shares: Optional[dict] = None
    sum_truth: Optional[dict] = None

    def to_dict(self) -> dict:
        """Plain data (the steps of ``bitwise`` as integers; JSON makes them strings, :meth:`from_dict` undoes)."""
        return {"bitwise": {s: dict(by_name) for s, by_name in self.bitwise.items()}, "shares": self.shares,
                "budgets": self.budgets, "true_shares": self.true_shares, "sum_truth": self.sum_truth}

    @classmethod
    def from_dict(cls, d: Optional[dict]) -> "Across":
        """The inverse of :meth:`to_dict`, whether the steps arrive as integers (a pipe) or strings (JSON)."""
        d = d or {}
        return cls(bitwise={int(s): dict(by_name) for s, by_name in (d.get("bitwise") or {}).items()},
                   shares=d.get("shares"), budgets=d.get("budgets"), true_shares=d.get("true_shares"),
                   sum_truth=d.get("sum_truth"))


def judge_bitwise(case: Case, per_rank: dict[int, Across], names: Optional[Sequence[str]] = None
                  ) -> list[tuple[str, Metric]]:
    """Every tensor of ``bitwise`` must be the same bits on every rank of each of the case's groups.

    ``per_rank``: each rank's :class:`Across`. A rank that did not take part in a step (it sent nothing for it)
    is left out of that step's comparison. ``names``: the tensors to compare in each step, in this order
    (default: every name some rank sent, sorted). Returns a failing metric per (step, tensor) that differs,
    named ``step_key(step, phase, name, across_ranks=True)``, steps in order.
    """
    out = []
    groups = [list(g) for g in (case.groups or [tuple(range(case.world_size))])]
    steps = sorted({s for a in per_rank.values() for s in a.bitwise})
    for s in steps:
        kind = STEP_KINDS[case.steps[s]]
        order = names if names is not None else sorted({n for a in per_rank.values() for n in a.bitwise.get(s, {})})
        for name in order:
            bad = compare_across(step_key(s, kind, name), {r: a.bitwise.get(s, {}).get(name)
                                                           for r, a in per_rank.items()}, groups)
            if bad is not None:
                out.append((step_key(s, kind, name, across_ranks=True), bad))
    return out


def of_results(results: list) -> dict[int, Across]:
    """Each rank's :class:`Across`, by rank, from the ranks' results."""
    return {r.rank: r.across for r in results}
