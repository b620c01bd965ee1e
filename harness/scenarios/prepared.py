"""A rank's inputs and float64 truths of one case, kept for the next implementation that runs the same case.

A run sends each case to every implementation in turn over the same warm ranks
(:func:`harness.engine.session.run_selection` orders (case, impl) pairs case by
case). The tensors a case regenerates from its seed (:func:`materialize`) and the
oracle's results for this rank depend only on the case and the rank, never on the
implementation, so each rank computes them once per case instead of once per
implementation: on the largest cases they are most of the rank's work.

A case drawn per rank (``draws="per-rank"``), prepared with the rank's
``exchange``, makes only this rank's tensors (the others' entries are None) and
computes its truth with the group-wide sums exchanged between the ranks
(:mod:`harness.engine.exchange`); only this rank's truth entries are filled.

Protocol: :func:`prepare` returns ``(data, truths)``; callers treat both as read-only
(the layer scenario hands implementations copies, see ``run_steps``). Memory is
bounded by one case: the entry is keyed by the case's full parameters (its seed
included) and the rank, and is dropped before another case is prepared, so the
peak is what one case needs anyway.
"""

from __future__ import annotations

from typing import Optional

from harness.catalog.case import LEGACY_COUNT, Case
from harness.catalog.data import DTYPES, CaseData, materialize
from harness.judge.oracle import StepTruth, run_oracle

_kept: Optional[tuple[tuple[Case, int], CaseData, list[StepTruth]]] = None
hits = 0  # how many preparations were served from the kept entry (for tests and benchmarks)


def case_key(case: Case, rank: int) -> tuple[Case, int]:
    """Everything that determines a rank's inputs and truths: the case's parameters (a frozen dataclass, compared
    field by field) and the rank."""
    return case, rank


def prepare(case: Case, rank: int, exchange=None) -> tuple[CaseData, list[StepTruth]]:
    """This rank's case data and its truths: computed, or kept from the last call.

    ``exchange`` (an :class:`~harness.engine.exchange.Exchange`), for a case drawn per rank: only this rank's
    inputs are made, and the oracle's sums cross between the ranks. Without it, every rank's inputs are made.
    """
    global _kept, hits
    key = case_key(case, rank)
    if _kept is not None and _kept[0] == key:
        hits += 1
        return _kept[1], _kept[2]
    _kept = None  # the previous case's tensors go before this one's are made
    own = exchange is not None and case.draws == "per-rank"
    if own:
        exchange.prepare()
    data = materialize(case, ranks=[rank] if own else None)
    truths = run_oracle(
        data.inputs, data.grad_outputs, case.steps, num_features=case.channels, eps=case.eps,
        momentum=case.momentum, affine=case.affine, track_running_stats=case.track_running_stats,
        weight=data.weight, bias=data.bias, param_dtype=DTYPES[case.param_dtype],
        running_mean=data.running_mean, running_var=data.running_var, groups=case.groups, ranks=[rank],
        frozen_buffers=case.setup == "stats-off-after",
        batches_tracked=LEGACY_COUNT if case.setup == "legacy-state-dict" else 0,
        exchange=exchange.sum if own else None)
    _kept = (key, data, truths)
    return data, truths


def forget() -> None:
    """Drop the kept entry (a rank about to run something else entirely, or a test)."""
    global _kept
    _kept = None
