"""The one symptom a short repro checks: the earliest step's first failure, in the record's own words."""

from __future__ import annotations

import pytest

from harness.judge.metric import Metric, Problem
from harness.repro.symptom import Aspect, NoSymptom, Symptom, symptom_of
from harness.judge.status import RankOutcome, RankStatus, Status
from harness.results.records import Record


def record(status=Status.MISMATCH, metrics=None, ranks=()) -> Record:
    return Record(case="x/y/ws2", family="x", params={}, impl="p:Q", status=status, metrics=metrics or {},
                  ranks=list(ranks), message="rank 0: something")


def bad(ratio=5.0) -> Metric:
    return Metric(0.1, 0.1, 0.02, ratio)


def test_the_earliest_step_wins_then_the_scenarios_order():
    sym = symptom_of(record(metrics={
        "rank0.step1.train.output": bad(),
        "rank0.step0.train.output": Metric(0.0, 0.0, 1.0, 0.0),  # passes
        "rank0.step0.train.running_var": bad(),
        "rank0.step0.train.num_batches_tracked": Metric.failure("num_batches_tracked 0, expected 1"),
    }))
    assert sym == Symptom(Status.MISMATCH, "running_var", Aspect.VALUE, 0, message="rank 0: something")
    assert sym.status is Status.MISMATCH and sym.aspect is Aspect.VALUE


@pytest.mark.parametrize("name, problem, kind, want", [
    ("rank1.step0.train.output", "dtype torch.float32, expected torch.float16", Problem.DTYPE,
     ("output", Problem.DTYPE)),
    ("rank1.step0.eval.grad_input", "3 non-finite values where the oracle is finite", Problem.NON_FINITE,
     ("grad_input", Problem.NON_FINITE)),
    ("rank0.step0.train.output", "output not in torch.channels_last", Problem.LAYOUT, ("output", Problem.LAYOUT)),
    ("step0.train.running_mean.across_ranks", "running_mean differs across ranks", None,
     ("running_mean", Aspect.ACROSS_RANKS)),
    ("step0.grad_weight_sum", None, None, ("grad_weight", Aspect.VALUE)),
])
def test_what_is_wrong_with_the_tensor(name, problem, kind, want):
    metric = Metric.failure(problem, kind) if problem else bad()
    sym = symptom_of(record(metrics={name: metric}))
    assert sym.quantity == want[0] and sym.aspect is want[1]


def test_errors_crashes_and_hangs_name_the_first_rank_that_failed():
    err = symptom_of(record(Status.ERROR, ranks=[
        RankOutcome(0, RankStatus.PEER_FAILED),
        RankOutcome(1, RankStatus.ERROR, exception_type="TypeError", message="momentum is None")]))
    assert (err.status, err.exception_type, err.message) == (Status.ERROR, "TypeError", "momentum is None")
    crash = symptom_of(record(Status.CRASH, ranks=[RankOutcome(0, RankStatus.CRASH, signal="SIGABRT")]))
    assert crash.describe() == "a rank dies (SIGABRT)"
    assert symptom_of(record(Status.HANG)).describe() == "the ranks hang"


def test_what_the_short_form_cannot_state_says_so():
    with pytest.raises(NoSymptom, match="--long"):
        symptom_of(record(metrics={"collectives.eval": Metric.failure("eval issued an all_gather")}))
    with pytest.raises(NoSymptom, match="no failure"):
        symptom_of(record(Status.PASS))


def test_a_cuda_only_library_gets_a_file_that_needs_a_gpu_and_no_stand_ins():
    """apex's optimized extension runs CUDA kernels only: its file runs on the GPU, without torch's stand-ins."""
    from harness import catalog
    from harness.repro.short import Target, source

    [case] = catalog.select(["allgather-shape/empty-0-5/float16-float32/contiguous/ws2"])
    crash = Symptom(Status.CRASH, signal="SIGFPE")
    apex = source(case, Target("apex", "apex", "from apex.parallel import SyncBatchNorm", on_cuda=False,
                               cuda_only=True), crash, seen="crash on a GPU")
    assert 'DEVICE = "cuda"\n' in apex and "stand_in_cuda_ops" not in apex
    assert "and a GPU" in apex and "torch.cuda.set_device" in apex
    torch_file = source(case, Target("torch", "torch", "from torch.nn import SyncBatchNorm", on_cuda=True), crash,
                        seen="crash")
    assert 'DEVICE = "cuda" if torch.cuda.is_available() else "cpu"' in torch_file  # the CPU demonstration
    assert "def stand_in_cuda_ops" in torch_file and "CPU demonstration, not evidence" in torch_file
    cpu_file = source(case, Target("x", "x", "from x import SyncBatchNorm", on_cuda=False), crash, seen="crash")
    assert 'DEVICE = "cpu"' in cpu_file and "cuda" not in cpu_file.split("BACKEND =")[1].split("\n")[0]
