"""Severity and reach of a failing record: the kinds in their order, the ULP line, reach from the parameters."""

from __future__ import annotations

import math

from harness.judge.metric import Metric, Problem
from harness.judge.status import Status
from harness.results.records import Record
from harness.judge.status import WORST_FIRST
from harness.results.severity import ULP_SCALE, Severity, assess, of_status, reach

PLAIN = {"dtype": "float32", "param_dtype": "float32", "memory_format": "contiguous", "batch_sizes": [3, 5],
         "spatial": [[4, 4], [4, 4]], "steps": ["train"], "momentum": 0.1, "affine": True,
         "track_running_stats": True, "groups": None, "input_mean": 0.0, "input_scale": 1.0}


def record(status=Status.MISMATCH, metrics=None, **params) -> Record:
    return Record(case="x/y/ws2", family="x", params={**PLAIN, **params}, impl="p:Q", status=status,
                  metrics=metrics or {})


def value(rel: float) -> Metric:
    return Metric(rel, rel, rel / 10, 10.0)


def test_kinds_are_ordered_worst_first():
    nonfinite = record(metrics={"rank0.step0.train.output": Metric.failure(
        "3 non-finite values where the oracle is finite", Problem.NON_FINITE)})
    wrong = record(metrics={"rank0.step0.train.running_var": value(0.02)})
    precision = record(metrics={"rank0.step0.train.output": value(4 * 2.0**-24)})
    dtype = record(metrics={"rank0.step0.train.output": Metric.failure(
        "dtype torch.float32, expected torch.float16", Problem.DTYPE)})
    assessed = [assess(r) for r in (nonfinite, wrong, record(Status.HANG), record(Status.CRASH),
                                    record(Status.ERROR), dtype, precision)]
    assert [a.kind for a in assessed] == list(Severity)
    assert [k.rank for k in Severity] == list(range(len(Severity)))
    assert sorted(assessed, key=lambda a: a.rank) == assessed
    assert assess(record(Status.PASS)) is None and assess(record(Status.UNSUPPORTED)) is None


def test_each_kind_says_what_a_user_notices_and_the_summary_names_it():
    hang = assess(record(Status.HANG))
    assert hang.kind is Severity.HANG and hang.notice() == "the job stalls until a collective times out"
    assert hang.summary().startswith("hang; reach: common configurations")
    running = assess(record(metrics={"rank0.step0.train.running_var": value(0.02)}))
    assert running.notice() == "running_var silently wrong (relative error 0.02): eval after training differs"
    assert running.summary().startswith("silent wrong value (relative error 0.02); reach:")
    dtype = assess(record(metrics={"rank0.step0.train.output": Metric.failure("dtype", Problem.DTYPE)}))
    assert dtype.notice().startswith("output has the right values in the wrong dtype")
    assert all("{" not in k.notice.format(q="x", err="", effect="y") for k in Severity)


def test_a_status_is_its_own_severity_only_where_the_evidence_cannot_say_more():
    assert [of_status(s) for s in WORST_FIRST] == [Severity.CRASH, Severity.HANG, Severity.ERROR, None, None, None,
                                                   None]


def test_precision_is_judged_in_the_tensors_own_dtype():
    """The same relative error is a wrong value in float32 and precision in float16 (parameters or input)."""
    rel = 8 * 2.0**-11  # 8 half roundoffs: far past float32's ULP_SCALE, within half's
    assert rel > ULP_SCALE * 2.0**-24 and rel <= ULP_SCALE * 2.0**-11
    out = {"rank0.step0.train.output": value(rel)}
    running = {"rank0.step0.train.running_var": value(rel)}
    assert assess(record(metrics=out)).kind is Severity.SILENT_WRONG_VALUE
    assert assess(record(metrics=out, dtype="float16")).kind is Severity.PRECISION  # the output is in the input's dtype
    assert assess(record(metrics=running, dtype="float16")).kind is Severity.SILENT_WRONG_VALUE  # buffers: float32
    assert assess(record(metrics=running, dtype="float16", param_dtype="float16")).kind is Severity.PRECISION


def test_the_worst_value_names_the_quantity_and_a_sum_counts_as_its_tensor():
    a = assess(record(metrics={"rank0.step0.train.output": value(1e-3), "step0.grad_weight_sum": value(0.5),
                               "rank1.step0.train.running_mean.across_ranks": Metric.failure("differs")}))
    assert (a.kind, a.quantity, a.rel_err) == (Severity.SILENT_WRONG_VALUE, "grad_weight", 0.5)
    assert "grad_weight silently wrong (relative error 0.5)" in a.notice()
    sum_nan = Metric.failure("2 non-finite values", Problem.NON_FINITE)
    assert math.isinf(assess(record(metrics={"step1.grad_bias_sum": sum_nan})).rel_err)


def test_reach_names_common_settings_and_what_makes_a_case_rare():
    tags, common, rare = reach({**PLAIN, "dtype": "float16", "memory_format": "channels_last",
                                "batch_sizes": [0, 4], "steps": ["train", "eval"]})
    assert common and not rare
    assert tags == ("float16 input with float32 parameters (autocast)", "channels_last",
                    "an empty rank (an uneven last batch)", "eval after training")
    tags, common, rare = reach({**PLAIN, "momentum": None, "groups": [[0], [1]], "input_mean": 1000.0,
                                "dtype": "float32", "param_dtype": "float64"})
    assert not common
    assert rare == ("float32 input with float64 parameters", "momentum=None", "process subgroups",
                    "inputs with a large offset or a tiny spread")
    tags, _, _ = reach({**PLAIN, "batch_sizes": [16, 16], "spatial": [[56, 56], [56, 56]]})
    assert "100,352 values per channel" in tags  # past float16's 65,504
