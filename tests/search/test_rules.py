"""The search's rules with scripted records and a fake clock: no process, no real time.

- an explored case's records: a new failure starts a shrink (the first one only), a known issue is a known
  finding (never shrunk), a failure that a finding explains is one more symptom of it;
- while shrinking, a record is the target exactly when it fails from the same origin;
- a shrink runs no new case past its deadline or its runs; exploring stops at the case count or the budget;
- the explorer, driven by a scripted session, a fake clock and a small case space, keeps to all of it: the
  budget ends exploring, a shrink settles on the smallest case failing the same way (never on one failing
  another way), runs no more than its limits allow, and keeps the original when it may run nothing; one
  defect showing on several tensors is one finding with its symptoms, two defects of one origin under
  different conditions are two;
- a finding round-trips through the summary's JSON, which ``promote`` reads back as findings.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from hypothesis import strategies as st

from harness.judge.metric import Metric
from harness.judge.status import Status
from harness.results.records import KnownIssueMatch, Record
from harness.search import promote, space
from harness.search.explore import Explorer
from harness.search.rules import Explored, Finding, Rules, Shrinking

CASE = space.make_case(batch_sizes=(2, 3, 1), spatial=((4,), (4,), (4,)), channels=3)
SMALL = space.make_case(batch_sizes=(2, 3), spatial=((4,), (4,)), channels=1)
LINK = "https://github.com/pytorch/pytorch/issues/1"


def record(impl: str = "a", status: Status = Status.PASS, failing="rank0.step0.train.output",
           known: bool = False, case=CASE) -> Record:
    """A scripted record: a mismatch fails ``failing`` (a name or several), a known one matches the known-issues
    file."""
    names = (failing,) if isinstance(failing, str) else tuple(failing)
    metrics = {n: Metric(1.0, 1.0, 0.1, 9.0) for n in names} if status == Status.MISMATCH else {}
    issue = KnownIssueMatch(link=LINK, expected=(status.value,), matched=True) if known else None
    return Record(case=case.id, family=case.family, params=case.params(), impl=impl, status=status,
                  metrics=metrics, known_issue=issue)


def shrinking(rules: Rules, impl: str = "a", rec=None, now: float = 100.0) -> Shrinking:
    out = rules.explored(CASE, [(impl, rec or record(impl, Status.MISMATCH))], [], 7, now, now - 90.0)
    assert out.shrink is not None
    return out.shrink


def test_a_new_failure_starts_a_shrink_and_only_the_first_one_does():
    rules = Rules(max_cases=10, shrink_limit_s=30.0)
    records = [("a", record("a")), ("b", record("b", Status.MISMATCH)), ("c", record("c", Status.ERROR))]
    out = rules.explored(CASE, records, [], 4, 100.0, 12.5)
    s = out.shrink
    assert (s.impl, s.signature, s.original, s.record) == ("b", "b: mismatch (train.output)", CASE, records[1][1])
    assert (s.found_after, s.found_at_s, s.started, s.until, s.runs) == (4, 12.5, 100.0, 130.0, 0)
    assert out.known == [] and out.again == []  # c's error waits for a later round
    nothing = rules.explored(CASE, [("a", record("a")), ("b", record("b", Status.UNSUPPORTED))], [], 5, 0, 0)
    assert nothing == Explored()


def test_known_issues_are_known_findings_and_explained_failures_symptoms():
    rules = Rules(budget_s=60.0)
    known = record("k", Status.CRASH, known=True)
    plain = space.make_case(batch_sizes=(2, 2), spatial=((4,), (4,)), channels=1)
    b = Rules.finding(shrinking(rules, "b"), plain, record("b", Status.MISMATCH, case=plain))
    # b's defect starts in the training forward: the running statistics it fails next are its symptom too.
    records = [("k", known), ("b", record("b", Status.MISMATCH, "rank1.step0.train.running_var")),
               ("a", record("a", Status.HANG))]
    out = rules.explored(CASE, records, [b], 3, 50.0, 5.0)
    (f,) = out.known
    assert (f.signature, f.impl, f.known, f.link, f.found_after, f.found_at_s) == \
        ("k: crash (crash)", "k", True, LINK, 3, 5.0)
    assert f.original is f.minimal is CASE and f.record is f.original_record is known
    assert out.again == [(b, "b: mismatch (train.running_var)")]
    assert out.shrink.signature == "a: hang (timeout)"  # the known one is never shrunk
    # A known signature seen twice in one case is found once, then seen again.
    twice = rules.explored(CASE, [("k", known), ("k", known)], [], 3, 50.0, 5.0)
    assert len(twice.known) == 1 and twice.again == [(twice.known[0], "k: crash (crash)")] and twice.shrink is None


def test_while_shrinking_only_the_same_failure_is_the_target():
    rules = Rules(max_cases=10)
    s = shrinking(rules)
    assert rules.is_target(s, SMALL, record("a", Status.MISMATCH, "rank1.step3.train.output", case=SMALL))
    assert not rules.is_target(s, SMALL, record("a", Status.MISMATCH, "rank0.step0.train.running_var", case=SMALL))
    assert not rules.is_target(s, SMALL, record("a", Status.ERROR, case=SMALL))
    assert not rules.is_target(s, SMALL, record("a", Status.PASS, case=SMALL))
    assert not rules.is_target(s, SMALL, record("b", Status.MISMATCH, case=SMALL))
    # A smaller case that needs a trait the original lacks is another defect's, not this one's.
    offset = space.make_case(batch_sizes=(2, 3), spatial=((4,), (4,)), channels=1, input_mean=1000.0)
    assert not rules.is_target(s, offset, record("a", Status.MISMATCH, case=offset))
    # The finding is the shrink's, with the minimal case; the minimal record decides whether it is known.
    s.runs = 5
    smaller = record("a", Status.MISMATCH, case=SMALL)
    f = rules.finding(s, SMALL, smaller)
    assert (f.minimal, f.record, f.original, f.shrink_runs, f.known, f.found_after) == \
        (SMALL, smaller, CASE, 5, False, 7)
    known = rules.finding(s, SMALL, record("a", Status.MISMATCH, known=True, case=SMALL))
    assert known.known and known.link == LINK


def test_a_shrink_stops_at_its_time_limit_and_at_its_run_limit():
    timed = Rules(budget_s=10.0, shrink_limit_s=30.0)
    s = shrinking(timed, now=100.0)
    assert not timed.must_stop(s, 100.0) and not timed.must_stop(s, 130.0)
    assert timed.must_stop(s, 130.01)
    counted = Rules(budget_s=10.0, shrink_limit_s=30.0, shrink_max_runs=3)
    s = shrinking(counted, now=100.0)
    s.runs = 2
    assert not counted.must_stop(s, 101.0)
    s.runs = 3
    assert counted.must_stop(s, 101.0)


def test_the_budget_ends_exploring():
    assert Rules.default_shrink_limit(None) == 60.0 and Rules.default_shrink_limit(1200.0) == 300.0
    timed = Rules(budget_s=10.0)
    assert not timed.spent(10_000, 9.99) and timed.spent(0, 10.0)
    assert timed.stopped_by(5) == "budget"
    counted = Rules(max_cases=5)
    assert not counted.spent(4, 1e9) and counted.spent(5, 0.0)
    assert counted.stopped_by(5) == "max-cases"
    with pytest.raises(ValueError, match="budget"):
        Rules()


class Clock:
    """A fake clock: each run takes ``per_run`` seconds, nothing else takes any."""

    def __init__(self, per_run: float = 1.0):
        self.now, self.per_run = 1000.0, per_run

    def __call__(self) -> float:
        return self.now


class Session:
    """A scripted session: implementation ``a`` fails train.output on cases with ``fails_from`` channels or more,
    and raises instead (another failure) from ``other_from`` channels on."""

    def __init__(self, clock: Clock, fails_from: int, other_from: float):
        self.impls, self.unavailable, self.clock, self.ran = [SimpleNamespace(name="a")], (), clock, []
        self.fails_from, self.other_from = fails_from, other_from

    def run_one(self, case, impl):
        self.clock.now += self.clock.per_run
        self.ran.append(case.id)
        if case.channels < self.fails_from:
            return record(impl.name, case=case)
        if case.channels >= self.other_from:
            return record(impl.name, Status.ERROR, case=case)
        return record(impl.name, Status.MISMATCH, case=case)


class SmallExplorer(Explorer):
    """The explorer over a small space (channels, ranks, seed), so that hypothesis draws and shrinks quickly."""

    def _strategy(self):
        def case(channels: int, ranks: int, seed: int):
            return space.make_case(batch_sizes=(2,) * ranks, spatial=((3,),) * ranks, channels=channels, seed=seed)

        return st.builds(case, st.integers(1, 30), st.integers(2, 4), st.integers(0, 10**6))


def explore(clock: Clock, fails_from: int = 2, other_from: float = float("inf"), **kw) -> tuple:
    session = Session(clock, fails_from, other_from)
    return SmallExplorer(session, seed=3, clock=clock, **kw).run(), session


def test_the_explorer_stops_at_its_budget_and_shrinks_to_the_smallest_same_failure():
    result, session = explore(Clock(per_run=1.0), budget_s=30.0, shrink_limit_s=1e6)
    # Only runs take time here: the budget was reached by the last case explored, shrinking counted.
    assert result.stopped_by == "budget" and result.elapsed_s == result.runs == 30
    (f,) = result.new
    assert f.signature == "a: mismatch (train.output)" and (f.minimal.channels, f.minimal.world_size) == (2, 2)
    assert f.shrink_runs > 0 and f.occurrences >= 1
    assert result.runs <= result.cases_explored + f.shrink_runs  # a case drawn again is not run again
    assert result.runs == len(session.ran) == len(set(session.ran))  # memoized: no case ran twice
    assert result.explore_s == result.elapsed_s - f.shrink_runs  # the shrink's time is not exploring time


def test_the_explorer_shrinks_past_another_failure_to_the_same_one():
    # Twenty channels and more raise, which the smaller cases failing train.output never stand in for.
    result, _ = explore(Clock(), fails_from=2, other_from=20, max_cases=100, shrink_limit_s=1e6)
    assert result.stopped_by == "max-cases"
    minimal = {f.signature: (f.minimal.channels, f.original.channels) for f in result.new}
    assert sorted(minimal) == ["a: error (error)", "a: mismatch (train.output)"], minimal
    assert minimal["a: mismatch (train.output)"][0] == 2
    assert minimal["a: error (error)"][0] == 20


@pytest.mark.parametrize("limit", [{"shrink_max_runs": 3}, {"shrink_limit_s": 2.5}], ids=["runs", "time"])
def test_the_explorer_shrinks_no_longer_than_its_limits(limit):
    result, _ = explore(Clock(per_run=1.0), fails_from=5, max_cases=10, **limit)
    assert result.stopped_by == "max-cases" and result.cases_explored == 10
    (f,) = result.new
    # Three new runs (at 0, 1 and 2 s into the shrink), no more: the shrink took the three seconds they took.
    assert f.shrink_runs == 3 and result.elapsed_s - result.explore_s == 3
    assert f.minimal.channels <= f.original.channels


def test_a_shrink_that_may_run_nothing_keeps_the_original():
    result, _ = explore(Clock(per_run=1.0), fails_from=5, max_cases=10, shrink_max_runs=0)
    (f,) = result.new
    assert f.minimal == f.original and f.shrink_runs == 0


def test_a_finding_round_trips_and_promote_reads_findings_back(tmp_path):
    s = shrinking(Rules(max_cases=3))
    s.runs = 4
    new = Rules.finding(s, SMALL, record("a", Status.MISMATCH, case=SMALL))
    known = Finding("k: crash (crash)", "k", True, CASE, record("k", Status.CRASH, known=True), CASE,
                    record("k", Status.CRASH, known=True), 2, 1.25, link=LINK, occurrences=3)
    for f in (new, known):
        again = Finding.from_dict(json.loads(json.dumps(f.to_dict())))
        assert again.to_dict() == f.to_dict()
        assert (again.original, again.minimal, again.known, again.record.known) == (f.original, f.minimal,
                                                                                 f.known, f.known)
    summary = tmp_path / "findings.json"
    summary.write_text(json.dumps({"findings": [known.to_dict(), new.to_dict()]}))
    (read,) = promote.from_summary(summary)
    assert isinstance(read, Finding) and read.minimal == SMALL and read.signature == new.signature
    assert read.record.status == Status.MISMATCH and read.original == CASE
