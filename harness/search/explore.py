"""Explore the case space, shrink each new failure, group findings by cause.

Protocol. The search runs in rounds, each one hypothesis run (generation
and shrinking are hypothesis's; the strategy is :mod:`harness.search.space`)
over a property that runs a drawn case on the warm pools of one
:class:`~harness.engine.session.Session` (anything with its
:class:`SearchSession` shape). What each record decides is
:mod:`harness.search.rules`'s; the explorer reads its clock (a callable
passed in) and hands the readings to them:

1. *Exploring*: each drawn case runs with every implementation. A failure
   that no finding so far explains (:mod:`harness.search.cause`: an earlier
   or the same origin, in a case that meets the finding's condition) and
   that is not a known issue becomes the round's *target* (a
   :class:`~harness.search.rules.Shrinking`), and the property fails; one
   that a finding explains is one more symptom of it.
2. *Shrinking*: from then on the property runs only the target's
   implementation and fails exactly when the failure starts where the
   target's does, so hypothesis shrinks the case to the smallest and
   plainest one that fails *from the same origin*. Its last call replays that minimal case; then ranks are
   removed one at a time while the origin holds (a rank is several draws,
   which hypothesis rarely removes together).
3. The shrunk failure is a finding, unless its origin and condition nest
   with an earlier finding's: then it is that cause, shrunk another way, and
   is folded into it (:meth:`~harness.search.rules.Rules.merge`). The next
   round starts from a seed derived from ``--seed`` and the round number.

Results are memoized per (case ID, implementation): hypothesis replays
examples, and a replay must not run (or flake). Known issues (the
known-issues file matched on the generated case's ID, which names its dtypes,
split and settings) are tallied and kept as known findings, not shrunk.

Budget: exploration stops when the time budget or the case count is spent
(a round draws at most :data:`ROUND` cases); the shrink of a finding may
continue past it for at most ``shrink_limit`` seconds (and ``shrink_max_runs``
new runs, when given), after which no new case runs and hypothesis settles on
the smallest failure seen. The same seed, build and implementations draw the
same cases.
"""

from __future__ import annotations

import builtins
import collections
import random
import time
from dataclasses import dataclass, field
from typing import Callable, Collection, Optional, Protocol, Sequence

from harness.catalog.case import Case
from harness.errors import UsageError
from harness.results.records import Record
from harness.search.rules import Finding, Rules, Shrinking
from harness.search.signature import signature
from harness.search import systems as training
from harness.search.space import WORLD_SIZES, strategy, without_rank

ROUND = 25  # cases drawn per hypothesis run before the budget is looked at again
# Python 3.11's exception groups (hypothesis raises one when a run found several distinct failures).
_GROUPS = tuple(t for t in (getattr(builtins, "BaseExceptionGroup", None),) if t is not None)


class SearchSession(Protocol):
    """What the explorer reads of a session (:class:`~harness.engine.session.Session` has it)."""

    impls: Sequence  # the adapters, each with a ``name``
    unavailable: Collection[str]  # names of those that cannot run here

    def run_one(self, case: Case, impl) -> Record:
        """The record of one (case, implementation)."""


@dataclass
class SearchResult:
    """What a search did: counts, the rate, and its findings (new first)."""

    seed: int
    impls: list[str]
    cases_explored: int = 0
    runs: int = 0  # (case, impl) runs, shrinking included
    elapsed_s: float = 0.0
    explore_s: float = 0.0
    statuses: collections.Counter = field(default_factory=collections.Counter)
    findings: list[Finding] = field(default_factory=list)
    stopped_by: str = ""

    @property
    def new(self) -> list[Finding]:
        return [f for f in self.findings if not f.known]

    @property
    def rate(self) -> float:
        """Cases explored per second of exploration (shrinking not counted)."""
        return self.cases_explored / self.explore_s if self.explore_s > 0 else 0.0

    def to_dict(self) -> dict:
        return {"seed": self.seed, "impls": self.impls, "cases_explored": self.cases_explored, "runs": self.runs,
                "elapsed_s": round(self.elapsed_s, 2), "explore_s": round(self.explore_s, 2),
                "cases_per_s": round(self.rate, 2), "statuses": dict(self.statuses), "stopped_by": self.stopped_by,
                "findings": [f.to_dict() for f in self.findings]}


class _Found(Exception):
    """The property's failure: the drawn case failed from the round's target origin."""

    def __init__(self, case: Case, record: Record):
        super().__init__(signature(record))  # hypothesis shows it; the rules compare causes
        self.case = case
        self.record = record


def _found_in(exc: BaseException) -> _Found:
    """The property's failure in what hypothesis raised (itself, or within a group; anything else re-raised)."""
    if isinstance(exc, _Found):
        return exc
    found = [e for e in exc.exceptions if isinstance(e, _Found)] if _GROUPS and isinstance(exc, _GROUPS) else []
    if not found:
        raise exc
    return found[-1]


def _fail(case: Case, record: Record) -> None:
    # One raise site: hypothesis tells failures apart by where they are raised, and exploring and shrinking
    # must be one failure to it.
    raise _Found(case, record)


class Explorer:
    """One search over ``session``'s implementations (see the module docstring); ``clock`` is read for the
    budget, the shrink's deadline and the findings' times (seconds, any origin). ``on_finding(f, into)`` is
    called with each shrunk or known finding, ``into`` the earlier finding it was folded into (or None)."""

    def __init__(self, session: SearchSession, *, seed: int = 0, budget_s: Optional[float] = None,
                 max_cases: Optional[int] = None, shrink_limit_s: Optional[float] = None,
                 shrink_max_runs: Optional[int] = None, backends: tuple = (None, "nccl-contract"),
                 world_sizes: Optional[tuple] = None, allow_large: bool = True, systems: tuple = ("layer",),
                 on_case: Optional[Callable[["Explorer"], None]] = None,
                 on_finding: Optional[Callable[[Finding, Optional[Finding]], None]] = None,
                 clock: Callable[[], float] = time.monotonic):
        self.rules = Rules(budget_s=budget_s, max_cases=max_cases, shrink_max_runs=shrink_max_runs,
                           shrink_limit_s=(shrink_limit_s if shrink_limit_s is not None
                                           else Rules.default_shrink_limit(budget_s)))
        self.session = session
        self.impls = [i for i in session.impls if i.name not in session.unavailable]
        self._impl_named = {i.name: i for i in self.impls}
        self.seed = seed
        self.clock = clock
        self.backends = backends
        self.world_sizes = tuple(world_sizes or WORLD_SIZES)
        self.allow_large = allow_large
        self.systems = tuple(systems)  # layer or names in training.SYSTEMS (the command's --system checks them)
        wrong = [w for w in self.world_sizes if w not in WORLD_SIZES]
        if wrong:
            raise UsageError(f"--world-size {wrong[0]}: search draws world sizes among "
                             f"{', '.join(map(str, WORLD_SIZES))}")
        self.on_case = on_case
        self.on_finding = on_finding
        self.result = SearchResult(seed=seed, impls=[i.name for i in session.impls])
        self._memo: dict[tuple[str, str], Record] = {}
        self._shrinking: Optional[Shrinking] = None  # the round's target, once it has one
        self._shrink_s = 0.0  # time spent shrinking (not exploration: the rate leaves it out)
        self._t0 = 0.0

    # -- running ----------------------------------------------------------------------------------------------
    def _run(self, case: Case, impl) -> Record:
        key = (case.id, impl.name)
        if key not in self._memo:
            self._memo[key] = self.session.run_one(case, impl)
            self.result.runs += 1
            if len(self._memo) > 4096:  # bounded: drop the oldest (hypothesis replays recent examples)
                self._memo.pop(next(iter(self._memo)))
        return self._memo[key]

    def elapsed(self) -> float:
        """Seconds since the search started."""
        return self.clock() - self._t0

    def _spent(self) -> bool:
        return self.rules.spent(self.result.cases_explored, self.elapsed())

    def _property(self, case: Case) -> None:
        if self._shrinking is not None:
            return self._shrink_step(case)
        if self._spent():
            return None  # the round ends without running what is left of it
        self.result.cases_explored += 1
        records = []
        for impl in self.impls:
            rec = self._run(case, impl)
            self.result.statuses[rec.status.value] += 1
            records.append((impl.name, rec))
        now = self.clock()
        out = self.rules.explored(case, records, self.result.findings, self.result.cases_explored, now,
                                  now - self._t0)
        for finding in out.known:
            self._add(finding)
        for finding, sig in out.again:
            finding.add_symptom(sig)
        if self.on_case:
            self.on_case(self)
        if out.shrink is not None:
            self._shrinking = out.shrink
            _fail(case, out.shrink.record)
        return None

    def _shrink_run(self, case: Case) -> Optional[Record]:
        """The shrink implementation's record of ``case``: memoized, or run while the shrink may run new cases
        (a new run counted); None when it may not (only cases already run can still fail)."""
        s = self._shrinking
        if (case.id, s.impl) not in self._memo:
            if self.rules.must_stop(s, self.clock()):
                return None
            s.runs += 1
        return self._run(case, self._impl_named[s.impl])

    def _shrink_step(self, case: Case) -> None:
        rec = self._shrink_run(case)
        if rec is not None and self.rules.is_target(self._shrinking, case, rec):
            _fail(case, rec)
        return None

    def _fewer_ranks(self, case: Case, record: Record) -> tuple[Case, Record]:
        """Hypothesis shrinks each draw; a rank is several draws (its batch, spatial size, per-step sizes) that
        it rarely removes together. So after it, try the case without each rank in turn, keeping the first
        that fails the same way, until none does, two ranks remain or the shrink may run no new case."""
        improved = True
        while improved and case.world_size > 2:
            improved = False
            for rank in range(case.world_size):
                # A training-system case's ranks are one drawn list, which hypothesis shortens itself.
                smaller = without_rank(case, rank) if training.system_of(case) is None else None
                if smaller is None:
                    continue
                rec = self._shrink_run(smaller)
                if rec is None:
                    return case, record
                if self.rules.is_target(self._shrinking, smaller, rec):
                    case, record, improved = smaller, rec, True
                    break
        return case, record

    def _add(self, finding: Finding) -> None:
        into = self.rules.merge(self.result.findings, finding)  # the same cause, shrunk another way: folded in
        if into is None:
            self.result.findings.append(finding)
        if self.on_finding:
            self.on_finding(finding, into)

    # -- rounds -----------------------------------------------------------------------------------------------
    def _round(self, number: int, examples: int) -> None:
        from hypothesis import HealthCheck, Phase, Verbosity, given, settings
        from hypothesis import seed as fixed_seed

        round_seed = random.Random(f"{self.seed}:{number}").getrandbits(64)

        @fixed_seed(round_seed)
        @settings(max_examples=examples, database=None, deadline=None, derandomize=False,
                  suppress_health_check=list(HealthCheck), phases=(Phase.generate, Phase.shrink),
                  report_multiple_bugs=False, verbosity=Verbosity.quiet, print_blob=False)
        @given(self._strategy())
        def prop(case):
            self._property(case)

        self._shrinking = None
        try:
            prop()
        except (_Found, *_GROUPS) as exc:
            found = _found_in(exc)
            minimal, record = self._fewer_ranks(found.case, found.record)
            self._add(self.rules.finding(self._shrinking, minimal, record))
        finally:
            shrinking, self._shrinking = self._shrinking, None
            if shrinking is not None:
                self._shrink_s += self.clock() - shrinking.started

    def _strategy(self):
        """Layer cases, training-system cases, or either (hypothesis shrinks a ``one_of`` toward its first)."""
        from hypothesis import strategies as st

        parts = []
        if "layer" in self.systems:
            parts.append(strategy(self.backends, self.world_sizes, self.allow_large))
        rest = tuple(s for s in self.systems if s != "layer")
        sizes = tuple(w for w in self.world_sizes if w in (2, 3))
        if rest and sizes:
            parts.append(training.strategy(rest, sizes))
        if not parts:
            raise UsageError("--world-size: training systems are drawn with 2 or 3 ranks")
        return parts[0] if len(parts) == 1 else st.one_of(parts)

    def run(self) -> SearchResult:
        """Explore until the budget is spent; return what was found."""
        self._t0 = self.clock()
        number = 0
        while not self._spent():
            before, found_before = self.result.cases_explored, len(self.result.findings)
            max_cases = self.rules.max_cases
            left = ROUND if max_cases is None else min(ROUND, max_cases - self.result.cases_explored)
            self._round(number, left)
            number += 1
            if self.result.cases_explored == before and len(self.result.findings) == found_before:
                self.result.stopped_by = "no case left to draw"
                break
        if not self.result.stopped_by:
            self.result.stopped_by = self.rules.stopped_by(self.result.cases_explored)
        self.result.elapsed_s = self.elapsed()
        self.result.explore_s = max(self.result.elapsed_s - self._shrink_s, 1e-9)
        self.result.findings.sort(key=lambda f: (f.known, f.found_after))
        return self.result
