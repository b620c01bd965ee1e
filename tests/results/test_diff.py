"""`diff`'s rules, without processes: how two records of a case compare (every kind of change, the growth rule,
a change of the collectives, which fails the gate only if asked), and the collectives' fingerprints and compile
notes it compares. The commands over real stores are tested in test_gate.py.
"""

from __future__ import annotations

import json

from judged_records import judged as make

from harness.results import fingerprint
from harness.results.diff import ChangeKind, GrowthRule, changes
from harness.results.gate import evaluate, format_result, junit_rows
from harness.judge.status import RankOutcome, RankStatus, Status
from harness.results.records import Record




def test_compare_classifies_every_kind_of_change():
    before = [make("a/pass-to-crash/ws2", Status.PASS), make("a/fixed/ws2", Status.MISMATCH, 3.0),
              make("a/crash-to-hang/ws2", Status.CRASH), make("a/grew/ws2", Status.PASS, 0.05),
              make("a/noise/ws2", Status.PASS, 1e-4), make("a/gone/ws2", Status.PASS)]
    after = [make("a/pass-to-crash/ws2", Status.CRASH), make("a/fixed/ws2", Status.PASS),
             make("a/crash-to-hang/ws2", Status.HANG), make("a/grew/ws2", Status.PASS, 0.5),
             make("a/noise/ws2", Status.PASS, 9e-4), make("a/new/ws2", Status.MISMATCH, 2.0)]
    found = {c.case: c for c in changes(before, after)}
    assert {k: c.kind for k, c in found.items()} == {
        "a/pass-to-crash/ws2": ChangeKind.NEW_FAILURE, "a/fixed/ws2": ChangeKind.FIXED,
        "a/crash-to-hang/ws2": ChangeKind.STATUS_CHANGE, "a/grew/ws2": ChangeKind.GROWTH,
        "a/noise/ws2": ChangeKind.SAME, "a/gone/ws2": ChangeKind.ONLY_BEFORE, "a/new/ws2": ChangeKind.ONLY_AFTER}
    assert {k for k, c in found.items() if c.regression} == {"a/pass-to-crash/ws2", "a/grew/ws2"}
    assert "worst err/tol 0.05 -> 0.5 (x10)" in found["a/grew/ws2"].describe()


def test_growth_rule_needs_both_the_factor_and_the_floor():
    rule = GrowthRule(factor=2.0, floor=0.1)
    assert rule.grew(0.05, 0.21) and not rule.grew(0.05, 0.19)  # floor: 2 x 0.1
    assert rule.grew(0.3, 0.61) and not rule.grew(0.3, 0.59)
    assert rule.grew(None, 0.5) and not rule.grew(0.5, None)
    assert make("a/x/ws2", Status.MISMATCH, 1e12).worst_ratio == float("inf")
    # Infinite ratios survive the trip through JSON (as "inf") and still count as the worst.
    assert Record.from_dict(json.loads(json.dumps(make("a/x/ws2", Status.MISMATCH, 1e12).to_dict()))).worst_ratio \
        == float("inf")


def said(record: Record, *per_rank: list) -> Record:
    record.ranks = [RankOutcome(rank=r, status=RankStatus.PASS, collectives=calls) for r, calls in enumerate(per_rank)]
    return record


def gather(dtype="float32", n=11, op="all_gather", step=0, group=(0, 1)):
    return {"op": op, "group": list(group), "dtype": dtype, "shape": [n], "numel": n, "step": step}


def test_a_change_of_the_collectives_is_its_own_kind_and_fails_the_gate_only_if_asked():
    two = [gather(), gather("float32", 10, "all_reduce")]
    before = [said(make("a/more/ws2", Status.PASS), two, two),
              said(make("a/renamed/ws2", Status.PASS), [gather()], [gather()]),
              said(make("a/same/ws2", Status.PASS), two, two),
              make("a/unknown/ws2", Status.PASS)]  # written before fingerprints: nothing to compare
    after = [said(make("a/more/ws2", Status.PASS), two + [gather("float32", 10, "all_reduce")], two),
             said(make("a/renamed/ws2", Status.PASS), [gather(op="all_gather_single")], [gather()]),
             said(make("a/same/ws2", Status.PASS), two, two),
             said(make("a/unknown/ws2", Status.PASS), two, two)]
    found = {c.case: c for c in changes(before, after)}
    assert {k: c.kind for k, c in found.items()} == {
        "a/more/ws2": ChangeKind.COLLECTIVES, "a/renamed/ws2": ChangeKind.COLLECTIVES, "a/same/ws2": ChangeKind.SAME,
        "a/unknown/ws2": ChangeKind.SAME}
    assert found["a/more/ws2"].describe() == (
        "pass -> pass, collectives rank 0: 2 -> 3 collectives; #2 none -> all_reduce float32[10] @[0, 1]")
    assert "#0 all_gather float32[11] @[0, 1] -> all_gather_single float32[11] @[0, 1]" in \
        found["a/renamed/ws2"].describe()
    assert not any(c.regression for c in found.values())
    reported = evaluate(before, after)
    assert reported.exit_code == 0 and len(reported.collectives_changed) == 2
    assert "gate: 0 regressions, 2 with other collectives (reported, not failing), pass (exit 0)" in \
        format_result(reported, "base.json")
    strict = evaluate(before, after, fail_on_collectives=True)
    assert strict.exit_code == 1 and format_result(strict, "base.json").count("COLLECTIVES CHANGED") == 2
    assert {r["name"] for r in junit_rows(strict) if r["outcome"] == "failure"} == {"a/more/ws2", "a/renamed/ws2"}


def test_a_rank_stopped_mid_case_is_compared_over_the_calls_both_sides_reached():
    crash = [gather("float16")]
    before, after = make("a/crash/ws2", Status.CRASH), make("a/crash/ws2", Status.CRASH)
    before.ranks = [RankOutcome(rank=0, status=RankStatus.CRASH, collectives=crash),
                    RankOutcome(rank=1, status=RankStatus.PEER_FAILED, collectives=[gather()])]
    after.ranks = [RankOutcome(rank=0, status=RankStatus.CRASH, collectives=crash),
                   RankOutcome(rank=1, status=RankStatus.PEER_FAILED,
                               collectives=[gather(), gather("float32", 10, "all_reduce")])]
    assert fingerprint.change(before, after) is None  # how far the peer got before the abort is timing
    after.ranks[1].collectives = [gather("float16")]
    assert fingerprint.change(before, after) == ("rank 1: #0 all_gather float32[11] @[0, 1] -> "
                                                 "all_gather float16[11] @[0, 1]")


def test_a_graph_break_in_two_environments_reads_the_same():
    from harness.results import compile_stats

    reason = ("Attempted to call function marked as skipped (skip reason: file matches MOD_SKIPLIST "
              "(/work/{}/lib/python3.11/site-packages/torch/_compile))")
    a, b = (compile_stats.portable(reason.format(v)) for v in (".venv", ".venv-cuda"))
    assert a == b and "(torch/_compile))" in a


def test_the_compact_view_counts_repeats_per_step_and_marks_subgroups():
    calls = [gather(), gather("float32", 10, "all_reduce"), gather("float32", 10, "all_reduce"),
             gather("float16", 4, step=1, group=(0, 2))]
    assert fingerprint.compact(calls, world_size=2) == (
        "step 0: all_gather float32[11], all_reduce float32[10] x2 | step 1: all_gather float16[4] @[0,2]")
    assert fingerprint.compact([], 2) == "-" and fingerprint.compact(None, 2) == "?"
