"""Search's findings by cause: a failure's origin, a case's condition, and the explorer grouping by them.

- ``cause_of``: the earliest stage of the first failing step over every rank, NaN and wrong values alike; a
  wrong dtype is a cause of its own; a desync, an error, a crash and a hang name what they are;
- ``condition``: a case's traits, so that a shrunk case's are what its failure needs;
- the explorer, driven by scripted sessions and a fake clock over a small space of traits: one defect showing
  on different tensors, steps and ranks is one finding with its symptoms listed; two defects of one origin
  under different conditions are two findings, each shrunk to its condition.
"""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import strategies as st

from harness.judge.metric import Metric, Problem
from harness.judge.status import RankOutcome, RankStatus, Status
from harness.results.records import Record
from harness.search import space
from harness.search.cause import STAGES, Cause, cause_of, condition
from harness.search.explore import Explorer

PLAIN = space.make_case(batch_sizes=(2, 2), spatial=((3,), (3,)), channels=1)


def failed(*names: str, kinds: dict = None, status: Status = Status.MISMATCH, case=PLAIN, **fields) -> Record:
    """A record of implementation ``a`` failing ``names`` (``kinds``: name -> a structural kind)."""
    kinds = kinds or {}
    metrics = {n: Metric(1.0, 1.0, 0.1, 9.0, problem="structural" if n in kinds else None, kind=kinds.get(n))
               for n in names}
    return Record(case=case.id, family=case.family, params=case.params(), impl="a", status=status, metrics=metrics,
                  **fields)


def test_the_origin_is_the_earliest_stage_of_the_first_failing_step_over_every_rank():
    # Rank 0 is empty: its first failing tensor is running_mean, rank 1's the output: the forward is the origin.
    both = failed("rank0.step3.train.running_mean", "rank1.step3.train.output", "rank1.step3.train.grad_input")
    assert cause_of(both) == Cause("a", Status.MISMATCH, "training forward", staged=True)
    assert str(cause_of(both)) == "a: mismatch (in the training forward)"
    # An earlier step decides, whatever fails later.
    early = failed("rank0.step1.eval.output", "rank0.step0.train.running_var", "rank1.step0.train.grad_weight")
    assert cause_of(early).origin == "running statistics"
    assert cause_of(failed("rank0.step0.train.grad_input")).origin == "backward"
    assert cause_of(failed("rank0.step2.train.num_batches_tracked", "rank0.step2.train.running_mean")).origin == \
        "num_batches_tracked"
    assert cause_of(failed("rank0.step0.train.output.across_ranks")).origin == "agreement across ranks"
    # A wrong dtype is its own cause, not one more wrong value; a scenario's own check is named as it is.
    dtype = failed("rank0.step0.train.output", kinds={"rank0.step0.train.output": Problem.DTYPE})
    assert cause_of(dtype) == Cause("a", Status.MISMATCH, "train.output: dtype")
    assert cause_of(failed("convert.03")) == Cause("a", Status.MISMATCH, "convert")
    # NaN and a wrong value start at the same place.
    nan = failed("rank0.step0.train.output", kinds={"rank0.step0.train.output": Problem.NON_FINITE})
    assert cause_of(nan) == cause_of(failed("rank0.step0.train.output"))


def test_errors_crashes_and_hangs_name_what_they_are_and_a_pass_has_no_cause():
    raised = failed(status=Status.ERROR, ranks=[RankOutcome(0, RankStatus.ERROR, exception_type="ValueError")])
    assert cause_of(raised) == Cause("a", Status.ERROR, "ValueError")
    died = failed(status=Status.CRASH, ranks=[RankOutcome(1, RankStatus.CRASH, signal="SIGABRT")])
    assert cause_of(died).origin == "SIGABRT"
    assert cause_of(failed(status=Status.HANG)).origin == "timeout"
    assert cause_of(failed(status=Status.PASS)) is None


def test_an_earlier_stage_explains_a_later_one_of_the_same_implementation_and_status_only():
    forward, running = (Cause("a", Status.MISMATCH, s, staged=True) for s in STAGES[:3:2])
    assert forward.explains(running) and not running.explains(forward) and forward.explains(forward)
    assert not forward.explains(Cause("b", Status.MISMATCH, STAGES[2], staged=True))
    assert not forward.explains(Cause("a", Status.MISMATCH, "train.output: dtype"))
    assert Cause("a", Status.ERROR, "ValueError").explains(Cause("a", Status.ERROR, "ValueError"))
    assert not Cause("a", Status.ERROR, "ValueError").explains(Cause("a", Status.ERROR, "TypeError"))


def test_a_case_condition_names_its_traits():
    assert condition(PLAIN) == frozenset()
    busy = space.make_case(batch_sizes=(0, 3), spatial=((70_000,), (70_000,)), channels=2, dtype="float16",
                           momentum=None, input_mean=1000.0, steps=("train", "eval"), input_layout="permuted")
    assert condition(busy) == {"half input", "an empty rank", "uneven ranks", "momentum=None", "a large offset",
                               "evaluation", "permuted input", "more than 65,536 values per channel on a rank"}


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Scripted:
    """A session whose implementation ``a`` fails as ``fails(case)`` says (a record, or None for a pass)."""

    def __init__(self, clock: Clock, fails):
        self.impls, self.unavailable, self.clock, self.fails = [SimpleNamespace(name="a")], (), clock, fails

    def run_one(self, case, impl):
        self.clock.now += 1.0
        return self.fails(case) or failed(status=Status.PASS, case=case)


class TraitExplorer(Explorer):
    """The explorer over a small space of traits: channels, ranks, an empty rank, momentum, an offset, eval."""

    def _strategy(self):
        def case(channels, ranks, empty, momentum, offset, evaluate, seed):
            sizes = (0 if empty else 2,) + (2,) * (ranks - 1)
            return space.make_case(batch_sizes=sizes, spatial=((3,),) * ranks, channels=channels, momentum=momentum,
                                   input_mean=offset, steps=("train", "eval") if evaluate else ("train",), seed=seed)

        return st.builds(case, st.integers(1, 8), st.integers(2, 3), st.booleans(), st.sampled_from((0.1, None)),
                         st.sampled_from((0.0, 1000.0)), st.booleans(), st.integers(0, 10**6))


def search(fails, cases: int = 80):
    clock = Clock()
    return TraitExplorer(Scripted(clock, fails), seed=5, clock=clock, max_cases=cases, shrink_limit_s=1e6).run()


def test_one_defect_on_several_tensors_steps_and_ranks_is_one_finding_with_its_symptoms():
    """A running-statistics defect under momentum=None: the first failing tensor is running_var, running_mean
    where rank 0 is empty, and with three or more channels only the evaluation after it fails (the running
    statistics within their budget): one cause, its symptoms listed, its condition momentum=None."""

    def fails(case):
        if case.momentum is not None:
            return None
        if case.channels >= 3 and "eval" in case.steps:
            return failed("rank0.step1.eval.output", case=case)
        if case.batch_sizes[0] == 0:
            return failed("rank0.step0.train.running_mean", "rank1.step0.train.running_var", case=case)
        return failed("rank0.step0.train.running_var", case=case)

    result = search(fails)
    (f,) = result.new
    assert f.condition == {"momentum=None"} and f.cause.origin == "running statistics", f.title
    assert len(f.symptoms) >= 2 and sum(f.symptoms.values()) == f.occurrences > 1, f.symptoms
    assert f.title == "a: mismatch (in the running statistics), with momentum=None"


def test_two_defects_of_one_origin_under_different_conditions_are_two_findings():
    """Both wrong in the training forward: one under momentum=None, one with a large input offset."""

    def fails(case):
        if case.momentum is None or case.input_mean:
            return failed("rank1.step0.train.output", case=case)
        return None

    result = search(fails, cases=120)
    conditions = sorted(sorted(f.condition) for f in result.new)
    assert conditions == [["a large offset"], ["momentum=None"]], [f.title for f in result.new]
    assert all(f.cause.origin == "training forward" for f in result.new)
