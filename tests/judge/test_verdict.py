"""The verdict's rules, one at a time, on scripted rank outcomes and metrics (no process, no torch)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from harness.judge.metric import Metric
from harness.judge.status import RankOutcome, RankStatus, Status
from harness.judge.verdict import LayerRefusal, case_verdict, from_ranks, rank_verdict

LAYER = LayerRefusal("cpu", "float32", "float64", "RuntimeError: mixed dtype (CPU)")


def _rank(r: int, status: RankStatus, message: str = "", kind=None, calls=None) -> RankOutcome:
    return RankOutcome(rank=r, status=status, exception_type=kind, message=message, collectives=calls)


def _call(dtype: str, numel: int = 8) -> dict:
    return {"op": "all_gather", "group": [0, 1], "step": 0, "dtype": dtype, "shape": [numel], "numel": numel}


def _ok() -> Metric:
    return Metric.passed()


def _bad() -> Metric:
    return Metric(max_abs_err=2.0, max_rel_err=0.5, tol=1.0, ratio=2.0)


# ---------------------------------------------------------------- rule 1: a rank's own verdict

def test_a_rank_that_raised_is_an_error_with_the_exception_text_whatever_its_metrics():
    assert rank_verdict({"y": _bad()}, raised=ValueError("bad dtype")) == (RankStatus.ERROR, "bad dtype")


def test_a_rank_passes_when_every_tensor_is_within_tolerance():
    assert rank_verdict({"y": _ok(), "grad_input": _ok()}) == (RankStatus.PASS, "")


def test_a_rank_mismatches_naming_the_first_four_failing_tensors_and_counting_the_rest():
    metrics = {f"t{i}": _bad() for i in range(6)} | {"fine": _ok()}
    status, message = rank_verdict(metrics)
    assert status is RankStatus.MISMATCH
    assert [part.split(":")[0] for part in message.split("; ")] == ["t0", "t1", "t2", "t3"]
    assert message.endswith(" (+2 more)")


# ---------------------------------------------------------------- rule 2: the ranks together

@pytest.mark.parametrize("ranks, timed_out, want", [
    ([RankStatus.PASS, RankStatus.PASS], False, Status.PASS),
    ([RankStatus.CRASH, RankStatus.HANG, RankStatus.ERROR], False, Status.CRASH),
    ([RankStatus.MISMATCH, RankStatus.HANG, RankStatus.ERROR], False, Status.HANG),
    ([RankStatus.MISMATCH, RankStatus.ERROR], False, Status.ERROR),
    ([RankStatus.MISMATCH, RankStatus.PASS], True, Status.HANG),  # out of time outranks wrong numbers
    ([RankStatus.MISMATCH, RankStatus.PEER_FAILED], False, Status.MISMATCH),
    ([RankStatus.PEER_FAILED, RankStatus.PASS], False, Status.ERROR),  # the culprit's failure was lost
])
def test_the_case_takes_its_worst_rank(ranks, timed_out, want):
    assert from_ranks([_rank(r, s) for r, s in enumerate(ranks)], timed_out) is want


# ---------------------------------------------------------------- rule 3: what the plain layer refuses too

def test_an_error_every_raising_rank_shares_with_the_plain_layer_is_unsupported():
    ranks = [_rank(0, RankStatus.ERROR, "mixed dtype (CPU)", "RuntimeError"), _rank(1, RankStatus.PASS)]
    v = case_verdict(Status.ERROR, ranks, "rank 0: error", finished=[1], layer=LAYER)
    assert v.status is Status.UNSUPPORTED
    assert v.message == f"{LAYER.text()}: the SyncBN raises what it replaces"


def test_a_rank_with_wrong_numbers_beside_the_layers_refusal_keeps_the_case_a_mismatch():
    ranks = [_rank(0, RankStatus.ERROR, "mixed dtype (CPU)", "RuntimeError"), _rank(1, RankStatus.MISMATCH)]
    v = case_verdict(Status.ERROR, ranks, "rank 0: error; rank 1: mismatch", finished=[1], layer=LAYER)
    assert v.status is Status.MISMATCH and v.message == f"rank 0: error; rank 1: mismatch; {LAYER.text()}"


@pytest.mark.parametrize("ranks", [
    [_rank(0, RankStatus.ERROR, "mixed dtype (CPU)", "RuntimeError"),
     _rank(1, RankStatus.ERROR, "other", "RuntimeError")],
    [_rank(0, RankStatus.ERROR, "mixed dtype (CPU)", "ValueError")],
])
def test_an_error_the_plain_layer_does_not_raise_stays_an_error(ranks):
    assert case_verdict(Status.ERROR, ranks, "m", finished=[], layer=LAYER).status is Status.ERROR


def test_without_a_layer_refusal_an_error_stays_an_error():
    ranks = [_rank(0, RankStatus.ERROR, "mixed dtype (CPU)", "RuntimeError")]
    assert case_verdict(Status.ERROR, ranks, "m", finished=[]).status is Status.ERROR


# ---------------------------------------------------------------- rule 4: the first desync

def test_a_desync_is_named_first_and_turns_a_pass_into_a_mismatch():
    ranks = [_rank(0, RankStatus.PASS, calls=[_call("float16")]), _rank(1, RankStatus.PASS, calls=[_call("float32")])]
    v = case_verdict(Status.PASS, ranks, "", finished=[0, 1])
    assert v.status is Status.MISMATCH
    assert v.message.startswith("desync: rank 0 all_gather float16[8] vs rank 1 float32[8]") and v.desync.index == 0


def test_a_desync_goes_ahead_of_the_crash_it_causes_and_leaves_the_crash_its_status():
    ranks = [_rank(0, RankStatus.CRASH, "killed", calls=[_call("float16")]),
             _rank(1, RankStatus.PEER_FAILED, calls=[_call("float32")])]
    v = case_verdict(Status.CRASH, ranks, "rank 0: crash (killed)", finished=[])
    assert v.status is Status.CRASH
    assert v.message.startswith("desync: ") and v.message.endswith("; rank 0: crash (killed)")


def test_ranks_that_agree_have_no_desync():
    ranks = [_rank(r, RankStatus.PASS, calls=[_call("float32")]) for r in (0, 1)]
    v = case_verdict(Status.PASS, ranks, "", finished=[0, 1])
    assert (v.status, v.desync, v.message) == (Status.PASS, None, "")


# ---------------------------------------------------------------- rule 5: across ranks

def test_a_failing_check_across_ranks_makes_a_pass_a_mismatch_and_its_metrics_join():
    ranks = [_rank(r, RankStatus.PASS) for r in (0, 1)]
    v = case_verdict(Status.PASS, ranks, "", finished=[0, 1],
                     across=lambda: [("buffers.running_mean", _bad()), ("grad_weight.sum", _ok())])
    assert v.status is Status.MISMATCH and v.message.startswith("buffers.running_mean: ")
    assert set(v.metrics) == {"buffers.running_mean", "grad_weight.sum"}


def test_passing_checks_across_ranks_keep_the_pass_and_still_join_the_metrics():
    v = case_verdict(Status.PASS, [_rank(0, RankStatus.PASS)], "", finished=[0],
                     across=lambda: [("grad_weight.sum", _ok())])
    assert v.status is Status.PASS and set(v.metrics) == {"grad_weight.sum"}


@pytest.mark.parametrize("status", [Status.ERROR, Status.CRASH, Status.HANG])
def test_checks_across_ranks_are_not_asked_of_a_case_whose_ranks_did_not_all_answer(status):
    def across():
        raise AssertionError("asked")

    ranks = [_rank(0, RankStatus.CRASH), _rank(1, RankStatus.PEER_FAILED)]
    assert case_verdict(status, ranks, "m", finished=[], across=across).status is status


# ---------------------------------------------------------------- nothing else sets a case's status

SETS_STATUS = {"harness/judge/verdict.py",  # the rules for a case that ran
               "harness/judge/status.py",  # the words and their groupings
               "harness/engine/admission.py"}  # the refusals before a case runs


def _status_values(node) -> list:
    """The ``Status.X`` a node gives as a value (directly, either branch of an ``if``, or in a tuple)."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Status":
        return [node]
    if isinstance(node, ast.IfExp):
        return _status_values(node.body) + _status_values(node.orelse)
    if isinstance(node, ast.Tuple):
        return [v for e in node.elts for v in _status_values(e)]
    return []


# What makes a record or decides one (a Symptom, which describes a record's failure for a repro, is not here).
MAKERS = {"Record", "record", "not_run", "Refusal", "Verdict"}


def _callee(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def test_no_module_but_the_verdict_and_the_refusals_gives_a_case_a_status():
    """A ``Status.X`` assigned, returned, passed as ``status=``, or given to what makes a record anywhere else in
    the package would be another place that decides why a case is red. Comparisons and tables are fine."""
    root = Path(__file__).resolve().parents[2]
    found = []
    for path in sorted((root / "harness").rglob("*.py")):
        name = str(path.relative_to(root))
        if name in SETS_STATUS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.Return)):
                given = _status_values(node.value) if node.value is not None else []
            elif isinstance(node, ast.keyword) and node.arg == "status":
                given = _status_values(node.value)
            elif isinstance(node, ast.Call) and _callee(node) in MAKERS:
                given = [v for a in node.args for v in _status_values(a)]
            else:
                continue
            found += [f"{name}:{v.lineno}: Status.{v.attr}" for v in given]
    assert not found, "\n".join(found)
