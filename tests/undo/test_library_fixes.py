"""Third-party fixes undone: the cases that reach each reported defect catch it when the fix is taken back.

Design: the plugins of tests/support/undone_apex.py and tests/support/undone_detectron2.py are the installed
library's class with one method (or the converter) recompiled from its own source with the lines as they were
before an upstream fix (tests/support/source_edits.py). Each runs through the real engine beside a control, the same
plugin without edits, on the case that reaches the defect; the undone fix must show what the report described,
which the control does not show. A control need not pass: apex's fallback merges uneven batches with equal weights
and detectron2's ``stats_mode="N"`` keeps a biased running variance (both in docs/findings.md), so what counts is
the symptom that only the undone fix has. apex is not on the package index: without it (CI) its rows are skipped,
saying so. Lightning#7026 lives in the Trainer, not in a layer: its undo is a ``sitecustomize`` the rank processes
import (tests/support/undo_lightning_7026/; they start as fresh interpreters for it), and ``--impl
lightning-trainer`` runs with and without it.

Not caught, and why (docs/coverage.md keeps these rows "reached"): apex#105's process group made in every forward
works over gloo (each rank makes the same groups in the same order; the reported stall was NCCL's).
"""

from __future__ import annotations

import os

import pytest

from harness import catalog
from harness.engine.session import RunOptions, resolve_impls, run_selection
from harness.impls.apex import probe
from harness.judge.status import Status
from harness.results.symptoms import failures

APEX_REASON = ("" if probe().kind == "fallback"
               else f"needs apex's Python fallback on PYTHONPATH (here: {probe().text})")
NEEDS_APEX = pytest.mark.skipif(bool(APEX_REASON), reason=APEX_REASON)

EMPTY = "allgather-shape/empty-0-5/float32-float32/contiguous/ws2"
# (plugin module, undone class, case, what only the undone fix shows: a status or a text in its failures)
UNDONE = [
    pytest.param("undone_detectron2", "EmptyAssertUndone", EMPTY, "SyncBatchNorm does not support empty inputs",
                 id="detectron2-2612e4a9"),
    pytest.param("undone_detectron2", "EmptyGradUndone", EMPTY, Status.HANG, id="detectron2-7c69c051"),
    pytest.param("undone_apex", "ReturnUndone", "allgather-shape/even-4-4/float32-float32/contiguous/ws2",
                 "Expected output to be a torch.Tensor", id="apex-384", marks=NEEDS_APEX),
    pytest.param("undone_apex", "ChannelLastUndone", "conversion/config/float32/uneven-3-5/ws2",
                 "unexpected keyword argument 'channel_last'", id="apex-167", marks=NEEDS_APEX),
    pytest.param("undone_apex", "NestedGroupUndone", "process-group/convert-nested-subgroup/ws4",
                 "collectives.group", id="apex-94", marks=NEEDS_APEX),
    pytest.param("undone_apex", "CountUndone", "conversion/nested/float32/uneven-3-5/ws2",
                 "num_batches_tracked", id="apex-380", marks=NEEDS_APEX),
    # The InstanceNorm made a SyncBatchNorm keeps no running statistics, and apex's fallback then raises in its
    # first training forward (num_batches_tracked is None: apex#1071, in cases/known_issues.toml).
    pytest.param("undone_apex", "InstanceNormUndone", "conversion/other-norms/float64/uneven-3-5/ws2",
                 "unsupported operand type(s) for +=: 'NoneType' and 'int'", id="apex-438", marks=NEEDS_APEX),
]


def _shows(record, want) -> bool:
    if isinstance(want, Status):
        return record.status is want
    return any(want in text for text in (*failures(record), record.message))


@pytest.mark.slow(8)
@pytest.mark.usefixtures("support_on_path")
@pytest.mark.parametrize(("module", "undone", "case", "want"), UNDONE)
def test_the_case_that_reaches_a_reported_defect_catches_its_fix_undone(module, undone, case, want):
    impls = resolve_impls([f"{module}:Control", f"{module}:{undone}"])
    control, changed = (next(r for r in run_selection(catalog.select([case]), [impl], RunOptions(timeout=60)))
                        for impl in impls)
    assert changed.status is not Status.PASS and _shows(changed, want), (
        f"{undone} on {case}: {changed.status.value}: {changed.message}")
    assert not _shows(control, want), f"the control shows it too: {control.status.value}: {control.message}"


UNDO_7026 = os.path.join(os.path.dirname(os.path.dirname(__file__)), "support", "undo_lightning_7026")


@pytest.mark.slow(6)
def test_a_trainer_given_a_strategy_by_hand_converts_until_lightning_7026_is_undone(monkeypatch):
    pytest.importorskip("lightning.pytorch")
    case = "conversion/config/float32/uneven-3-5/ws2"
    [installed] = run_selection(catalog.select([case]), resolve_impls(["lightning-trainer"]), RunOptions(timeout=60))
    assert installed.status is Status.PASS, installed.message
    # Fresh interpreters for the ranks (a forkserver started earlier in this process would not import it).
    monkeypatch.setenv("PYTHONPATH", UNDO_7026 + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("SYNCBN_HARNESS_START_METHOD", "spawn")
    [undone] = run_selection(catalog.select([case]), resolve_impls(["lightning-trainer"]), RunOptions(timeout=60))
    assert undone.status is Status.MISMATCH and "is still BatchNorm2d: not converted" in undone.message, (
        undone.status, undone.message)
