"""A sample of the committed sweeps run again: the same changes caught, the same mutants killed or surviving.

The full sweeps take about forty minutes on two cores (`syncbn-harness undo fixes`, `undo mutants`: see
docs/undoing-fixes.md); CI runs this sample of them. Two changes are undone from real release files, downloaded
as the command does (the smallest wheel of each release, from the package index), and up to seven mutants are
drawn from the committed results, the same ones every time: six that a case killed, one that survives (a
survivor costs its whole selection). Each runs over its own row's selection.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import catalog
from harness.selection import RunOptions
from harness.undo import fixes, outcomes, sources
from harness.undo.mutants import mutants
from harness.undo.page import outcome_class
from harness.undo.sweep import Sweep, Variant, installed_text

DOCS = Path(__file__).resolve().parents[2] / "docs" / "torch-fixes"


def _every_kth(ids: list[str], n: int) -> list[str]:
    ids = sorted(ids)
    step = max(len(ids) // n, 1)
    return ids[::step][:n]


@pytest.mark.sweep(300)
def test_a_sample_of_the_committed_sweeps_gives_the_committed_verdicts():
    fix_rows = outcomes.load(DOCS / "fixes.json")["rows"]
    mutant_rows = outcomes.load(DOCS / "mutants.json")["rows"]
    killed = _every_kth([i for i, r in mutant_rows.items() if outcome_class(r) == "caught"], 6)
    # A survivor costs its whole selection (minutes on two cores for the largest): one, of the fewest cases.
    alive = sorted((r.get("ran", 0), i) for i, r in mutant_rows.items() if outcome_class(r) == "not caught")[:1]
    alive = [i for _, i in alive]
    # Changes caught on a case the unchanged file passes: a catch that is a change of failure only (the unchanged
    # file already fails the case as a known defect) is not a sample's business.
    changes_run = _every_kth([i for i, r in fix_rows.items() if outcome_class(r) == "caught"
                              and r.get("control") == "pass"], 2)
    assert killed and changes_run, "the committed results hold no caught change or killed mutant to sample"
    made = {m.id: m for rel in sources.FILES for m in mutants(rel, installed_text(rel))}
    changes = {f.id: f for f in fixes.load()}
    got, want = {}, {}
    # Each row over its own run's cases, so that a verdict means the same (a mutant may have been run over a few
    # families, and only its survivors over all of them).
    by_selection: dict = {}
    for ident, rows in [(i, fix_rows) for i in changes_run] + [(i, mutant_rows) for i in killed + alive]:
        row = rows[ident]
        by_selection.setdefault((tuple(row.get("patterns", [])), row.get("exhaustive", False)), []).append(ident)
    for (patterns, exhaustive), idents in by_selection.items():
        with Sweep(catalog.select(list(patterns), exhaustive=exhaustive), RunOptions(timeout=60)) as sweep:
            for ident in idents:
                if ident in changes:
                    fix = changes[ident]
                    done, _ = fixes.undone(fix, installed_text(fix.file))
                    assert done.ok, (ident, done.reason)
                    verdict = sweep.judge(Variant(ident, {fix.file: done.text}, fix.cases))
                    got[ident], want[ident] = outcome_class({"case": verdict.case}), outcome_class(fix_rows[ident])
                else:
                    verdict = sweep.judge(Variant(ident, {made[ident].rel: made[ident].text}))
                    got[ident] = outcome_class({"case": verdict.case, "reason": verdict.reason})
                    want[ident] = outcome_class(mutant_rows[ident])
    assert got == want
