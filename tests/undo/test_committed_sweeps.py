"""The committed sweeps (docs/torch-fixes/): every result is of a change or mutant that exists, what ran is caught or
explained (the page lists what has not run yet), and they are the page's source.

The results files are what `syncbn-harness undo fixes|mutants --out docs/torch-fixes/...` wrote; these tests read
them (the main suite); test_sweep_sample.py runs a sample of them again (the sweep suite).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.undo import fixes, outcomes, page, sources
from harness.undo.mutants import mutants
from harness.undo.sweep import installed_text

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "torch-fixes"


@pytest.fixture(scope="module")
def committed():
    return (fixes.load(), outcomes.load(DOCS / "fixes.json"), outcomes.load(DOCS / "mutants.json"),
            page.survivors())


def _made() -> set[str]:
    return {m.id for rel in sources.FILES for m in mutants(rel, installed_text(rel))}


def test_every_result_is_of_a_change_listed_and_a_mutant_still_made(committed):
    changes, fix_data, mutant_data, _ = committed
    assert fix_data["rows"] and set(fix_data["rows"]) <= {f.id for f in changes}, "results of changes not listed"
    assert mutant_data["rows"] and set(mutant_data["rows"]) <= _made(), "results of mutants no longer made"


def test_what_the_sweeps_ran_leaves_nothing_unexplained(committed):
    """A change not run yet is listed as such on the page; everything that ran is caught or explained."""
    changes, fix_data, mutant_data, explained = committed
    left = page.problems(changes, fix_data["rows"], mutant_data["rows"], explained)
    assert [p for p in left if not p.endswith(": not run")] == []


def test_every_fix_and_feature_is_caught_or_says_why_not(committed):
    changes, fix_data, _, _ = committed
    for fix in changes:
        row = fix_data["rows"].get(fix.id)
        if row is not None and fix.kind in page.MUST_CATCH and not fix.uncatchable:
            assert page.outcome_class(row) == "caught", (fix.id, row)


def test_the_page_is_what_the_results_make(committed):
    changes, fix_data, mutant_data, explained = committed
    assert (ROOT / "docs" / "torch-fixes.md").read_text() == page.markdown(changes, fix_data, mutant_data,
                                                                           explained, len(_made())), \
        "docs/torch-fixes.md is stale: run `syncbn-harness undo page`"
