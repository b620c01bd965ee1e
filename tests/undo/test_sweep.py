"""Variants of torch's SyncBatchNorm run as torch@DIR until a case differs from the unchanged copy (harness.undo.sweep).

Real rank processes and gloo groups, over three cases. The undone change is written by this test: a release
history of two versions made from the installed file (the earlier one without the cast of the counts to the
running statistics' dtype, pytorch#98332), so the whole path (pick, undo, write, run, judge) runs without a
package index; the sweep test (test_sweep_sample.py) undoes real releases' changes.
"""

from __future__ import annotations

import pytest

from harness import catalog
from harness.selection import RunOptions
from harness.undo import fixes
from harness.undo.hunks import canonical
from harness.undo.sweep import Sweep, Variant, installed_text

F = "torch/nn/modules/_functions.py"
FLOAT32 = "allgather-shape/even-4-4/float32-float32/contiguous/ws2"
HALF = "allgather-shape/even-4-4/float16-float16/contiguous/ws2"
EMPTY = "allgather-shape/empty-0-5/float32-float32/contiguous/ws2"
CAST = "        if running_mean is not None and counts.dtype != running_mean.dtype:\n" \
       "            counts = counts.to(running_mean.dtype)\n"


@pytest.fixture(scope="module")
def sweep():
    with Sweep(catalog.select([FLOAT32, EMPTY, HALF]), RunOptions(timeout=60)) as s:
        yield s


@pytest.mark.slow(10)
def test_the_unchanged_copy_is_not_caught(sweep):
    verdict = sweep.judge(Variant("unchanged", {F: canonical(installed_text(F))}))
    assert not verdict.caught and verdict.ran == 3, verdict


@pytest.mark.slow(10)
def test_an_undone_change_is_caught_by_the_first_case_that_shows_it(sweep, tmp_path):
    installed = canonical(installed_text(F))
    assert CAST in installed, "the installed _functions.py no longer casts the counts: rewrite this test's history"
    for release, text in (("2.0.1", installed.replace(CAST, "")), ("2.1.0", installed)):
        path = tmp_path / release / F
        path.parent.mkdir(parents=True)
        path.write_text(text)
    fix = fixes.Fix(pr=98332, link="l", title="t", kind="fix", release="2.1.0", previous="2.0.1", file=F,
                    markers=("counts.to(running_mean.dtype)",), behaviour="b")
    done, how = fixes.undone(fix, installed_text(F), tmp_path)
    assert done.ok and how == "markers" and "counts.to(" not in done.text
    verdict = sweep.judge(Variant("cast undone", {F: done.text}))
    order = [c.id for c in sweep.cases]
    assert verdict.case == HALF and verdict.ran == order.index(HALF) + 1 and verdict.control == "pass", verdict
    assert verdict.status == "error" and "Expected counts to have type Half" in verdict.symptoms[0]
    assert sweep.killers[0] == HALF
    again = sweep.judge(Variant("cast undone again", {F: done.text}))
    assert again.case == HALF and again.ran == 1  # the case that caught a variant runs first


@pytest.mark.slow(10)
def test_a_variant_that_does_not_load_is_caught_with_the_reason(sweep):
    broken = canonical(installed_text(F)) + "\nimport no_such_module_anywhere\n"
    verdict = sweep.judge(Variant("broken", {F: broken}))
    assert verdict.caught and verdict.case is None and "no_such_module_anywhere" in verdict.reason, verdict
