"""The search's rules: records and clock readings in, decisions out.

Nothing here reads the clock, draws a case or runs one. Times are passed in
(readings of the explorer's clock, and seconds into the search), records are
given, and the answers are values; :mod:`harness.search.explore` drives
hypothesis and the session with them, tests drive them with scripted records
and a fake clock.

- :class:`Finding`: one cause of failure of one implementation
  (:mod:`harness.search.cause`) with its minimal case, its condition and the
  symptoms it showed; ``to_dict`` is its entry in the summary's JSON,
  ``from_dict`` reads it back (what ``promote`` takes).
- :class:`Shrinking`: the one failure being shrunk: the case and record it
  was first seen in, when, its cause, its runs and its deadline.
- :class:`Rules`: the budget and the shrink's limits, and the decisions:

  * an explored case's records (one per implementation, in order) yield an
    :class:`Explored`: the failures that a finding so far explains, each one
    more symptom of it (an earlier or the same origin, in a case that meets
    its condition), the known failures not seen before (a known finding
    each: tallied by signature, never shrunk), and the first failure that
    is neither, which starts a shrink (a second one in the same case waits
    for a later round, where it is drawn again or not);
  * while shrinking, a record is the target exactly when its cause is the
    shrink's and its case has no trait the original lacks: a smaller case
    failing from the same origin replaces the target, a failure from another
    origin, status or implementation does not, and neither does one that
    needs a trait the original did not have (another defect, most likely);
  * a shrink runs no new case once the clock is past its deadline or it has
    spent its runs;
  * the finding of a shrink is known when its *minimal* record is a known
    issue (a known issue may name what only the shrunk case shows plainly);
  * a new finding whose origin and condition nest with an earlier one's is
    that finding, shrunk another way: :meth:`Rules.merge` folds it in (the
    earlier origin and the smaller condition kept), so one defect is one
    finding however many tensors, steps and ranks it showed on;
  * exploring stops when the case count or the time budget is spent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from harness.catalog.case import Case
from harness.judge.status import Status
from harness.results.records import KnownIssueMatch, Record
from harness.search.cause import STAGES, Cause, cause_of, condition, describe, meets, nested
from harness.search.signature import signature
from harness.search.space import size_of


@dataclass
class Finding:
    """One cause of failure of one implementation: where it was first seen, its minimal case, its condition
    (the minimal case's traits) and its symptoms (each signature it showed, with the explored cases that did)."""

    signature: str  # how the case that started the shrink failed
    impl: str
    known: bool
    original: Case
    original_record: Record
    minimal: Case
    record: Record  # of the minimal case
    found_after: int  # cases explored up to and including the one that showed it
    found_at_s: float  # seconds into the search
    shrink_runs: int = 0  # runs of the implementation while shrinking
    occurrences: int = 1  # explored cases that failed this way
    link: Optional[str] = None
    repro_file: Optional[str] = None
    repro_verdict: Optional[str] = None  # what the repro file did when run alone (or why it is the long form)
    cause: Optional[Cause] = None  # None: the minimal record's
    symptoms: dict = field(default_factory=dict)  # signature -> explored cases that failed so (its own first)

    def __post_init__(self):
        if self.cause is None:
            self.cause = cause_of(self.record) or cause_of(self.original_record)
        if not self.symptoms:
            self.symptoms = {self.signature: self.occurrences}

    @property
    def condition(self) -> frozenset:
        """The minimal case's traits (:func:`harness.search.cause.condition`)."""
        return condition(self.minimal)

    @property
    def title(self) -> str:
        """The cause and its condition in words: what the summary heads the finding with."""
        return f"{self.cause}, with {describe(self.condition)}"

    def add_symptom(self, sig: str, cases: int = 1) -> None:
        """``cases`` more explored cases failed from this cause, showing ``sig``."""
        self.occurrences += cases
        self.symptoms[sig] = self.symptoms.get(sig, 0) + cases

    def to_dict(self) -> dict:
        """The finding as the summary's JSON lists it (:meth:`from_dict` reads it back)."""
        return {"signature": self.signature, "impl": self.impl, "known": self.known, "link": self.link,
                "status": self.record.status.value, "message": self.record.message,
                "minimal_case": self.minimal.id, "minimal_params": self.minimal.params(),
                "minimal": self.minimal.to_dict(),
                "minimal_size": size_of(self.minimal), "original_case": self.original.id,
                "original": self.original.to_dict(),
                "original_size": size_of(self.original), "found_after_cases": self.found_after,
                "found_at_s": round(self.found_at_s, 2), "shrink_runs": self.shrink_runs,
                "occurrences": self.occurrences, "repro_file": self.repro_file,
                "repro_verdict": self.repro_verdict, "cause": str(self.cause), "origin": self.cause.origin,
                "staged": self.cause.staged, "condition": sorted(self.condition), "symptoms": dict(self.symptoms)}

    @classmethod
    def from_dict(cls, d: dict) -> "Finding":
        """A finding from its :meth:`to_dict` (``Finding.from_dict(f.to_dict()).to_dict() == f.to_dict()``).

        The summary keeps of the records only the status and the minimal one's message, so the records are
        rebuilt from those (the original failed the same way, so with the same status; a known finding's
        records match its upstream link). A summary written before it kept the original case's data has the
        minimal case stand in for it. Missing keys are KeyError, bad values ValueError or TypeError."""
        minimal = Case.from_dict(d["minimal"])
        original = Case.from_dict(d["original"]) if d.get("original") else minimal
        known, link, status = bool(d.get("known")), d.get("link"), Status(d["status"])
        issue = KnownIssueMatch(link=link or "", expected=(status.value,), matched=True) if known else None

        def record(case: Case, case_id: str, params: dict, message: str) -> Record:
            return Record(case=case_id, family=case.family, params=params, impl=d["impl"], status=status,
                          message=message, known_issue=issue)

        return cls(signature=d["signature"], impl=d["impl"], known=known, original=original,
                   original_record=record(original, original.id, original.params(), ""), minimal=minimal,
                   record=record(minimal, d.get("minimal_case", minimal.id), d.get("minimal_params",
                                                                                   minimal.params()),
                                 d.get("message") or ""),
                   found_after=int(d.get("found_after_cases", 0)), found_at_s=float(d.get("found_at_s", 0.0)),
                   shrink_runs=int(d.get("shrink_runs", 0)), occurrences=int(d.get("occurrences", 1)), link=link,
                   repro_file=d.get("repro_file"), repro_verdict=d.get("repro_verdict"),
                   cause=Cause(d["impl"], status, d["origin"], bool(d.get("staged"))) if d.get("origin") else None,
                   symptoms=dict(d.get("symptoms") or {}))


@dataclass
class Shrinking:
    """The failure being shrunk: one implementation's signature, first seen in ``original``."""

    impl: str  # the implementation's name
    signature: str
    cause: Cause
    original: Case
    record: Record  # of the original case
    found_after: int  # cases explored when it was seen
    found_at_s: float  # seconds into the search when it was seen
    started: float  # the clock's reading when the shrink started
    until: float  # the clock's reading after which no new case runs
    runs: int = 0  # new runs (memoized replays are not counted)


@dataclass
class Explored:
    """What one explored case's records yield (see :meth:`Rules.explored`)."""

    again: list[tuple[Finding, str]] = field(default_factory=list)  # (the finding explaining it, the signature)
    known: list[Finding] = field(default_factory=list)  # known failures not seen before
    shrink: Optional[Shrinking] = None  # the first new failure that is not a known issue


@dataclass(frozen=True)
class Rules:
    """A search's budget and shrink limits, and the decisions made with them (see the module docstring)."""

    budget_s: Optional[float] = None  # seconds of exploring
    max_cases: Optional[int] = None  # cases explored
    shrink_limit_s: float = 60.0  # seconds one shrink may run new cases for
    shrink_max_runs: Optional[int] = None  # new runs one shrink may make (None: as many as its time allows)

    def __post_init__(self):
        if self.budget_s is None and self.max_cases is None:
            raise ValueError("a search needs a time budget or a number of cases")

    @staticmethod
    def default_shrink_limit(budget_s: Optional[float]) -> float:
        """A quarter of the budget, at least a minute (a quarter of 4 minutes without a time budget)."""
        return max(60.0, (budget_s or 240.0) / 4)

    def spent(self, cases_explored: int, elapsed_s: float) -> bool:
        """Whether exploring must stop: the case count or the time budget is spent."""
        if self.max_cases is not None and cases_explored >= self.max_cases:
            return True
        return self.budget_s is not None and elapsed_s >= self.budget_s

    def stopped_by(self, cases_explored: int) -> str:
        """What a search that ran out of budget was stopped by: ``max-cases`` or ``budget``."""
        return "max-cases" if self.max_cases is not None and cases_explored >= self.max_cases else "budget"

    def explored(self, case: Case, records: Sequence[tuple[str, Record]], findings: Sequence[Finding],
                 cases_explored: int, now: float, at_s: float) -> Explored:
        """What ``case``'s records (``(impl name, record)``, in the implementations' order) yield, given the
        ``findings`` so far; ``cases_explored`` counts this case, ``now`` is the clock's reading and ``at_s``
        the seconds into the search (where a shrink starts, and when the findings were seen)."""
        out = Explored()
        traits = condition(case)
        for impl, rec in records:
            sig = signature(rec)
            if sig is None:
                continue
            if rec.known:  # tallied by signature: the known-issues file names them
                owner = next((f for f in (*findings, *out.known) if f.known and f.signature == sig), None)
                if owner is not None:
                    out.again.append((owner, sig))
                else:
                    out.known.append(Finding(sig, impl, True, case, rec, case, rec, cases_explored, at_s,
                                             link=rec.known_issue.link))
                continue
            cause = cause_of(rec)
            owner = self.explaining(findings, cause, traits)
            if owner is not None:
                out.again.append((owner, sig))
            elif out.shrink is None:
                out.shrink = Shrinking(impl, sig, cause, case, rec, cases_explored, at_s, started=now,
                                       until=now + self.shrink_limit_s)
        return out

    @staticmethod
    def explaining(findings: Sequence[Finding], cause: Cause, traits: frozenset) -> Optional[Finding]:
        """The finding that explains a failure from ``cause`` in a case with ``traits``: one whose cause
        explains it (the same origin first, then the earliest) and whose condition the case meets."""
        fits = [f for f in findings if not f.known and f.cause.explains(cause) and meets(traits, f.condition)]
        return min(fits, key=lambda f: (f.cause != cause, STAGES.index(f.cause.origin) if f.cause.staged else 0),
                   default=None)

    @staticmethod
    def merge(findings: Sequence[Finding], new: Finding) -> Optional[Finding]:
        """The earlier finding that ``new`` is, shrunk another way (nested origins and conditions), with
        ``new`` folded into it (its symptoms, occurrences and shrink runs added; the earlier origin and the
        smaller condition's minimal case kept); None when ``new`` is a cause of its own."""
        if new.known:
            return None
        for f in findings:
            if f.known or not (f.cause.explains(new.cause) or new.cause.explains(f.cause)):
                continue
            if not nested(f.condition, new.condition):
                continue
            for sig, n in new.symptoms.items():
                f.add_symptom(sig, n)
            f.shrink_runs += new.shrink_runs
            if new.cause.explains(f.cause):
                f.cause = new.cause
            if new.condition < f.condition:
                f.minimal, f.record = new.minimal, new.record
            return f
        return None

    @staticmethod
    def is_target(shrinking: Shrinking, case: Case, record: Record) -> bool:
        """Whether ``case``, run by the shrink's implementation, fails as the failure being shrunk: from the
        same origin, with no trait the original case lacks (a shrink removes what the failure does not need,
        and never slides to another defect of the same origin by adding what that one needs)."""
        return cause_of(record) == shrinking.cause and condition(case) <= condition(shrinking.original)

    def must_stop(self, shrinking: Shrinking, now: float) -> bool:
        """Whether the shrink may run no new case: the clock is past its deadline or its runs are spent."""
        if self.shrink_max_runs is not None and shrinking.runs >= self.shrink_max_runs:
            return True
        return now > shrinking.until

    @staticmethod
    def finding(shrinking: Shrinking, minimal: Case, record: Record) -> Finding:
        """The shrink's finding, ``minimal`` failing as ``record`` shows (known when that record is)."""
        return Finding(shrinking.signature, shrinking.impl, record.known, shrinking.original, shrinking.record,
                       minimal, record, shrinking.found_after, shrinking.found_at_s, shrink_runs=shrinking.runs,
                       link=record.known_issue.link if record.known else None, cause=shrinking.cause)
