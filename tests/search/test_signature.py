"""Search signatures, without processes: a signature names the failure without steps or ranks, so a shrunk case
can keep it; its tensor kind is the judgement's, never read back from a message."""

from __future__ import annotations

import math

from harness.judge.metric import Metric, Problem
from harness.judge.status import RankOutcome, RankStatus, Status
from harness.results.records import Record
from harness.search.signature import signature, tensor_kind


def _record(status, metrics=None, ranks=None, desync=None, impl="x"):
    return Record(case="search/c", family="search", params={}, impl=impl, status=status,
                  metrics={k: (Metric(1.0, 1.0, 0.1, v) if isinstance(v, float) else v)
                           for k, v in (metrics or {}).items()},
                  ranks=ranks or [], desync=desync)


def test_signature_names_the_first_failing_tensor_without_step_or_rank():
    rec = _record(Status.MISMATCH, {"rank0.step0.train.output": 0.5, "rank0.step2.train.running_var": 9.0,
                                    "rank1.step1.eval.output": 3.0})
    assert signature(rec) == "x: mismatch (eval.output)"
    assert tensor_kind("step3.train.running_mean.across_ranks") == "train.running_mean.across_ranks"
    assert tensor_kind("rank1.convert.2") == "convert"
    # The kind is the judgement's (harness.judge.elementwise sets it), never read back from the message.
    wrong_dtype = _record(Status.MISMATCH, {"rank0.step0.train.output": Metric.failure(
        "dtype torch.float32, expected torch.float16", Problem.DTYPE)})
    nan = _record(Status.MISMATCH, {"rank0.step0.train.output": Metric(
        math.inf, math.inf, 0.0, math.inf, "2 non-finite values where the oracle is finite", Problem.NON_FINITE)})
    unkinded = _record(Status.MISMATCH, {"rank0.step0.train.output": Metric.failure("mentions a dtype, is none")})
    assert signature(wrong_dtype) == "x: mismatch (train.output: dtype)"
    assert signature(nan) == "x: mismatch (train.output: non-finite)"
    assert signature(unkinded) == "x: mismatch (train.output)"
    assert signature(_record(Status.PASS)) is None
    assert signature(_record(Status.UNSUPPORTED)) is None


def test_signature_of_errors_crashes_hangs_and_desyncs():
    err = _record(Status.ERROR, ranks=[RankOutcome(0, RankStatus.PEER_FAILED),
                                       RankOutcome(1, RankStatus.ERROR, exception_type="ValueError")])
    assert signature(err) == "x: error (ValueError)"
    crash = _record(Status.CRASH, ranks=[RankOutcome(1, RankStatus.CRASH, signal="SIGABRT")],
                    desync={"calls": {"0": {"op": "all_gather"}, "1": {"op": "all_gather"}}})
    assert signature(crash) == "x: crash (desync all_gather, SIGABRT)"
    assert signature(_record(Status.HANG)) == "x: hang (timeout)"
