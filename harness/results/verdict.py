"""One verdict over records: good, bad or untestable, with its reason; ``check`` and ``bisect`` both use it.

Protocol: :func:`judge` takes the records of one build's run of a
selection and says:

- **bad** when any record that ran failed unexpectedly (a mismatch, error,
  crash or hang that is not a known issue);
- **untestable** (``skip``) when nothing was selected, or every selected
  (case, impl) was skipped or unsupported: the build could not be tested;
- **good** otherwise: everything that ran passed, or failed exactly as a
  known issue says it does.

:attr:`Verdict.exit_code` is the ``git bisect run`` reading of it (0, 1,
125); ``check`` exits with it and ``bisect`` stores the verdict, so the two
cannot disagree about a build.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Iterable

from harness.errors import EXIT_FOUND, EXIT_UNTESTABLE
from harness.results.records import Record


class Verdict(str, enum.Enum):
    """What testing one build said (``check``'s 0, 1 and 125)."""

    GOOD = "good"
    BAD = "bad"
    SKIP = "skip"

    @property
    def exit_code(self) -> int:
        """``git bisect run``'s codes: 0 good, 1 bad, 125 cannot test."""
        return {Verdict.GOOD: 0, Verdict.BAD: EXIT_FOUND, Verdict.SKIP: EXIT_UNTESTABLE}[self]

    @classmethod
    def from_exit_code(cls, code: int) -> "Verdict":
        """``git bisect run``'s reading of an exit code: 0 good, 125 skip, 1..127 bad, else skip."""
        if code == 0:
            return cls.GOOD
        if 0 < code < 128 and code != EXIT_UNTESTABLE:
            return cls.BAD
        return cls.SKIP


@dataclass(frozen=True)
class Judgement:
    """The verdict, its reason, and the counts behind it."""

    verdict: Verdict
    reason: str
    passed: int = 0  # ran and passed (known issues not included)
    known: int = 0  # ran and failed as a known issue says (good)
    bad: list[Record] = field(default_factory=list)
    not_run: dict[str, str] = field(default_factory=dict)  # "<impl> <status>" -> the reason, once each


def judge(records: Iterable[Record]) -> Judgement:
    """The verdict over one build's records (see the module docstring)."""
    recs = list(records)
    not_run: dict[str, str] = {}
    for r in recs:
        if not r.ran:
            not_run.setdefault(f"{r.impl} {r.status.value}", r.message)
    runnable = [r for r in recs if r.ran]
    bad = [r for r in runnable if r.failed]
    known = sum(1 for r in runnable if not r.failed and r.known)
    passed = len(runnable) - len(bad) - known
    counts = dict(passed=passed, known=known, bad=bad, not_run=not_run)
    if not recs:
        return Judgement(Verdict.SKIP, "nothing selected", **counts)
    if not runnable:
        why = "; ".join(f"{k}: {v}" for k, v in not_run.items())
        return Judgement(Verdict.SKIP, f"every selected (case, impl) was skipped or unsupported: {why}", **counts)
    if bad:
        first = bad[0]
        return Judgement(Verdict.BAD, f"{len(bad)} of {len(runnable)} failed; first: {first.status.value} "
                                      f"{first.case} [{first.impl}] {first.message}", **counts)
    return Judgement(Verdict.GOOD, f"{len(runnable)} passed", **counts)


def exit_code(records: Iterable[Record]) -> int:
    """``run``'s exit code over its records: 1 when :func:`judge` finds the build bad (an unexpected failure),
    else 0 (unlike ``check``, a run that could run nothing is no failure of the build)."""
    return EXIT_FOUND if judge(records).verdict is Verdict.BAD else 0

