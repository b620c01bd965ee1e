"""Bisection as a pure state machine fed verdicts (after mozregression's ``bisector.py``).

Protocol: a :class:`Bisector` knows only how many builds there are, in order
(index 0 is the good end, the last index the bad end), and the verdicts it has
been fed. The driver asks :meth:`Bisector.next_index` which build to test,
evaluates it however it likes (a cache, a virtual environment, a test double)
and answers with :meth:`Bisector.feed`. When ``next_index`` returns None the
bisection is over and :meth:`Bisector.result` says what was found.

Order of questions:
1. The good end. Anything but GOOD stops: the range is wrong (or untestable).
2. The bad end. Anything but BAD stops.
3. Between the last known good (``lo``) and the first known bad (``hi``): the
   untested build nearest the midpoint. A SKIP (the build cannot be tested:
   install failed, ``check`` exited 125) leaves the bounds where they were, so
   the next question is the midpoint's nearest untested neighbour.
4. When nothing untested is left strictly between ``lo`` and ``hi``: FOUND if
   no skipped build lies between them (``hi`` is the first bad build, ``lo``
   the last good one), AMBIGUOUS otherwise (the first bad build is one of the
   skipped builds or ``hi``).

No I/O, no clock, no randomness: a sequence of verdicts always yields the same
questions, which is what the unit tests script.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Optional

from harness.results.verdict import Verdict


class Outcome(str, enum.Enum):
    """Where a bisection stands."""

    RUNNING = "running"
    FOUND = "found"  # first bad and last good are adjacent (no skipped build between them)
    AMBIGUOUS = "ambiguous"  # only skipped builds lie between the last good and the first bad
    GOOD_END_NOT_GOOD = "good-end-not-good"
    BAD_END_NOT_BAD = "bad-end-not-bad"


@dataclass
class Result:
    """The answer of a finished (or stopped) bisection, in indices of the build list."""

    outcome: Outcome
    last_good: Optional[int] = None
    first_bad: Optional[int] = None
    candidates: list[int] = field(default_factory=list)  # where the first bad build may be
    skipped: list[int] = field(default_factory=list)
    end_verdict: Optional[Verdict] = None  # the wrong verdict of an end, when an end stopped it

    def to_dict(self) -> dict:
        return {"outcome": self.outcome.value, "last_good": self.last_good, "first_bad": self.first_bad,
                "candidates": list(self.candidates), "skipped": list(self.skipped),
                "end_verdict": self.end_verdict.value if self.end_verdict else None}


class Bisector:
    """Which of ``n`` ordered builds to test next, given the verdicts so far."""

    def __init__(self, n: int):
        if n < 2:
            raise ValueError(f"bisection needs at least 2 builds (a good and a bad end), got {n}")
        self.n = n
        self.verdicts: dict[int, Verdict] = {}
        self.lo = 0  # last known good (once the good end is confirmed)
        self.hi = n - 1  # first known bad (once the bad end is confirmed)

    # ------------------------------------------------------------------ questions and answers

    def next_index(self) -> Optional[int]:
        """The index of the build to test next, or None when the bisection is over."""
        if self._stopped_at_end() is not None:
            return None
        if 0 not in self.verdicts:
            return 0
        if self.n - 1 not in self.verdicts:
            return self.n - 1
        untested = [i for i in range(self.lo + 1, self.hi) if i not in self.verdicts]
        if not untested:
            return None
        mid = (self.lo + self.hi) / 2
        # Nearest the midpoint; on a tie the lower index (mozregression's choice), deterministic.
        return min(untested, key=lambda i: (abs(i - mid), i))

    def feed(self, index: int, verdict: Verdict) -> None:
        """Record the verdict of build ``index`` (which ``next_index`` asked for, or a cached one)."""
        if not 0 <= index < self.n:
            raise ValueError(f"build index {index} out of range 0..{self.n - 1}")
        verdict = Verdict(verdict)
        self.verdicts[index] = verdict
        if index in (0, self.n - 1) or self._stopped_at_end() is not None:
            return
        if verdict is Verdict.GOOD:
            if index >= self.hi:
                raise ValueError(f"build {index} is good but build {self.hi} before it is bad: "
                                 "the builds are not in order, or a verdict is flaky")
            self.lo = max(self.lo, index)
        elif verdict is Verdict.BAD:
            if index <= self.lo:
                raise ValueError(f"build {index} is bad but build {self.lo} after it is good: "
                                 "the builds are not in order, or a verdict is flaky")
            self.hi = min(self.hi, index)

    # ------------------------------------------------------------------ the answer

    def _stopped_at_end(self) -> Optional[Result]:
        good_end = self.verdicts.get(0)
        if good_end is not None and good_end is not Verdict.GOOD:
            return Result(Outcome.GOOD_END_NOT_GOOD, end_verdict=good_end)
        bad_end = self.verdicts.get(self.n - 1)
        if bad_end is not None and bad_end is not Verdict.BAD:
            return Result(Outcome.BAD_END_NOT_BAD, end_verdict=bad_end)
        return None

    def result(self) -> Result:
        """Where the bisection stands (``RUNNING`` while questions remain)."""
        stopped = self._stopped_at_end()
        if stopped is not None:
            return stopped
        skipped = sorted(i for i, v in self.verdicts.items() if v is Verdict.SKIP)
        if self.next_index() is not None:
            return Result(Outcome.RUNNING, self.lo, self.hi, skipped=skipped)
        between = [i for i in range(self.lo + 1, self.hi)]
        if not between:
            return Result(Outcome.FOUND, self.lo, self.hi, candidates=[self.hi], skipped=skipped)
        return Result(Outcome.AMBIGUOUS, self.lo, self.hi, candidates=between + [self.hi], skipped=skipped)


def run(bisector: Bisector, evaluate) -> Result:
    """Drive ``bisector`` to the end, asking ``evaluate(index) -> Verdict`` for each question."""
    while (index := bisector.next_index()) is not None:
        bisector.feed(index, evaluate(index))
    return bisector.result()
