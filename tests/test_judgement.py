"""The proof that the catalog and the tolerances work, with real processes.

- Two correct SyncBNs written independently of the reference (textbook.py:
  autograd through differentiable all_reduces; gather.py: an all_gather of
  moments with a hand-written backward) raise no alarm on the whole default
  selection.
- Every planted defect (defects.py: the kinds real implementations shipped) is
  caught by default-selection cases of the families meant to catch it.
"""

from __future__ import annotations

import fnmatch
import os
from collections import Counter
from pathlib import Path

import pytest

from harness import catalog, runner
from harness.records import FAILURES, Status

SUPPORT = str(Path(__file__).parent / "support")


@pytest.fixture(autouse=True)
def _support_on_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", SUPPORT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def run(impl_names, cases, timeout=30):
    impls = runner.resolve_impls(impl_names)
    return list(runner.run_selection(cases, impls, runner.RunOptions(timeout=timeout)))


@pytest.mark.slow
def test_correct_implementations_raise_no_alarm_on_the_default_selection():
    cases = catalog.select()
    records = run(["textbook:TextbookSyncBN", "gather:GatherSyncBN"], cases)
    assert len(records) == 2 * len(cases)
    bad = [f"{r.impl} {r.case}: {r.status.value} {r.message}" for r in records if r.status != Status.PASS]
    assert not bad, "\n".join(bad)
    # Not a tolerance that passes anything: the worst error uses a small part of its budget.
    worst = max(m["ratio"] for r in records for m in r.metrics.values() if isinstance(m["ratio"], float))
    assert worst < 0.5


def _defects():
    import sys

    sys.path.insert(0, SUPPORT)
    import defects

    return defects.CATCHERS


@pytest.mark.slow
@pytest.mark.parametrize("defect", sorted(_defects(), key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_planted_defect_is_caught_by_the_default_selection(defect):
    patterns = _defects()[defect]
    cases = [c for c in catalog.select() if any(fnmatch.fnmatchcase(c.id, p) for p in patterns)]
    assert cases, f"no default case matches {patterns}"
    records = run([f"defects:{defect.__name__}"], cases, timeout=20)
    caught = [r for r in records if r.status in FAILURES]
    assert caught, f"{defect.__name__} passed every case of {patterns}: {Counter(r.status.value for r in records)}"
    # The failure is the judgement's or the engine's doing, with a message saying what is wrong.
    assert all(r.message for r in caught)
