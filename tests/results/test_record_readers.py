"""What readers ask of a record, answered by the record: its first failure, the first rank to fail a given way,
and its evidence (desync, diagnosis, compile) without reading the stored dicts by hand."""

from __future__ import annotations

from harness.judge.call import Call
from harness.judge.metric import Metric, Problem
from harness.judge.status import RankOutcome, RankStatus, Status
from harness.results.records import Record

GATHER = {"op": "all_gather", "group": [0, 1], "step": 1, "dtype": "float16", "shape": [7], "numel": 7}


def record(**kw) -> Record:
    return Record.from_dict(Record(case="x/y/ws2", family="x", params={}, impl="p:Q", status=Status.MISMATCH,
                                   **kw).to_dict())  # through the stored form, as readers get it


def test_the_first_failure_is_the_earliest_step_then_the_scenarios_order():
    ok, bad = Metric(0.0, 0.0, 1.0, 0.0), Metric(1.0, 1.0, 0.1, 10.0)
    r = record(metrics={"rank0.step1.train.output": bad, "rank0.step0.train.output": ok,
                        "rank0.step0.train.grad_input": Metric.failure(
                            "dtype torch.float32, expected torch.float16", Problem.DTYPE),
                        "rank1.step0.train.running_var.across_ranks": bad, "convert.00": bad})
    assert r.failing_metrics() == ["rank0.step0.train.grad_input", "rank1.step0.train.running_var.across_ranks",
                                   "rank0.step1.train.output", "convert.00"]
    assert r.first_failure() == "rank0.step0.train.grad_input"
    assert record(metrics={"rank0.step0.train.output": ok}).first_failure() is None


def test_the_first_rank_to_fail_a_given_way():
    r = record(ranks=[RankOutcome(0, RankStatus.PEER_FAILED), RankOutcome(1, RankStatus.CRASH, signal="SIGSEGV"),
                      RankOutcome(2, RankStatus.CRASH, exit_code=1)])
    assert r.first_rank(RankStatus.CRASH).rank == 1
    assert r.first_rank(RankStatus.ERROR) is None


def test_the_evidence_is_read_through_the_record():
    plain = record()
    assert (plain.desync_message, plain.desync_calls(), plain.diagnosis_summary, plain.compile_ranks()) == \
        ("", [], "", {})
    desync = {"group": [0, 1], "index": 0, "message": "rank 0 all_gather float16[7] vs rank 1 nothing",
              "calls": {"0": GATHER, "1": None}}
    diagnosis = {"env": {}, "status": "hang", "message": "", "ranks": [], "summary": "rank 1 waits in all_reduce"}
    r = record(desync=desync, diagnosis=diagnosis, compile={"backend": "eager", "ranks": {"0": {"graphs": 2}}})
    assert r.desync_message == desync["message"]
    assert r.desync_calls() == [Call.from_dict(GATHER)]
    assert r.diagnosis_summary == "rank 1 waits in all_reduce"
    assert r.compile_ranks() == {"0": {"graphs": 2}}
