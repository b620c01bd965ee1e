"""Differences between two builds' records: new failures, fixed cases, status changes, error growth.

Both sides are lists of records (a store file, a baseline file, a fresh
run). They are matched by (impl, case); when a side holds several records of
one pair (runs without ``--resume``), the last one counts.

Error growth compares the worst err/tol ratio of the two records
(:attr:`Record.worst_ratio`; <= 1 is within tolerance). Tiny errors move
by large factors between builds for no reason that matters (1e-4 -> 5e-4 of
the tolerance), so growth counts only when the new worst ratio is more than
``factor`` times the old one *and* more than ``factor`` times ``floor``
(:class:`GrowthRule`; defaults: factor 2, floor 0.1, i.e. a pass now using
over a fifth of its tolerance and at least twice what it used).

A change of the collectives the ranks issued (count, op, dtype, size, group;
:func:`harness.results.fingerprint.change`) with the same status on both
sides is its own kind, ``collectives changed``: not a regression (``gate``
fails on it only when asked), but never silent.

A change of what ``torch.compile`` did (graphs, graph-break or eager-frame
reasons; :func:`harness.results.compile_stats.change`) with the same status is
likewise its own kind, ``compilation changed``: a new graph break shows, and
``gate`` fails on it when asked. A fullgraph case that starts compiling is a
status change (error -> pass), listed as fixed.

A *regression* (what ``gate`` fails on) is a pass that became anything else,
or error growth. Pairs missing from one side are listed, never regressions.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Iterable, Optional

from harness.results import compile_stats, fingerprint
from harness.judge.status import FAILURES, Status
from harness.results.records import Record



class ChangeKind(enum.Enum):
    """How one (impl, case) changed, in the order reports list them (the value is how they name it)."""

    NEW_FAILURE = "new failure"
    GROWTH = "error growth"
    STATUS_CHANGE = "status change"
    COMPILATION = "compilation changed"
    COLLECTIVES = "collectives changed"
    FIXED = "fixed"
    ONLY_BEFORE = "only in A"
    ONLY_AFTER = "only in B"
    SAME = "same"

    def __str__(self) -> str:
        return self.value


MISSING_ON_A_SIDE = (ChangeKind.ONLY_BEFORE, ChangeKind.ONLY_AFTER)


@dataclass(frozen=True)
class GrowthRule:
    """When a larger worst err/tol ratio counts as error growth (see the module note)."""

    factor: float = 2.0
    floor: float = 0.1

    def grew(self, before: Optional[float], after: Optional[float]) -> bool:
        """Whether ``after`` is beyond ``factor`` times ``max(before, floor)``."""
        if after is None or math.isnan(after):
            return False
        base = max(before if before is not None and not math.isnan(before) else 0.0, self.floor)
        return after > self.factor * base


DEFAULT_RULE = GrowthRule()


@dataclass
class Change:
    """How one (impl, case) differs between the two sides."""

    impl: str
    case: str
    kind: ChangeKind
    before: Optional[Record]
    after: Optional[Record]
    ratio_before: Optional[float] = None
    ratio_after: Optional[float] = None

    @property
    def regression(self) -> bool:
        """A pass that became anything else, or error growth (what ``gate`` fails on)."""
        if self.before is None or self.after is None:
            return False
        return ((self.before.status == Status.PASS and self.after.status != Status.PASS)
                or self.kind is ChangeKind.GROWTH)

    @property
    def family(self) -> str:
        return (self.after or self.before).family

    def describe(self) -> str:
        """``pass -> mismatch: rank 1: ...`` or ``err/tol 0.03 -> 0.4 (x13)``."""
        b = self.before.status.value if self.before else "-"
        a = self.after.status.value if self.after else "-"
        text = f"{b} -> {a}"
        if self.kind is ChangeKind.GROWTH or (self.ratio_before is not None and self.ratio_after is not None
                                              and self.kind is ChangeKind.SAME):
            text = f"{text}, worst err/tol {_fmt(self.ratio_before)} -> {_fmt(self.ratio_after)}"
            if self.ratio_before and self.ratio_after is not None and math.isfinite(self.ratio_after):
                text += f" (x{self.ratio_after / self.ratio_before:.3g})"
        elif self.kind in (ChangeKind.NEW_FAILURE, ChangeKind.STATUS_CHANGE):
            if self.ratio_after is not None:
                text += f", worst err/tol {_fmt(self.ratio_after)}"
        elif self.kind is ChangeKind.COLLECTIVES:
            text += f", collectives {fingerprint.change(self.before, self.after)}"
        elif self.kind is ChangeKind.COMPILATION:
            text += f", {compile_stats.change(self.before, self.after)}"
        message = (self.after.message if self.after and self.after.status != Status.PASS else
                   self.before.message if self.kind is ChangeKind.FIXED and self.before else "")
        if message:
            text += f": {message.splitlines()[0][:200]}"
        return text

    def to_dict(self) -> dict:
        return {"impl": self.impl, "case": self.case, "family": self.family, "kind": self.kind.value,
                "regression": self.regression,
                "before": self.before.status.value if self.before else None,
                "after": self.after.status.value if self.after else None,
                "ratio_before": _json_num(self.ratio_before), "ratio_after": _json_num(self.ratio_after),
                "message": (self.after.message if self.after else "") or "",
                "description": self.describe()}


def _fmt(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.3g}"


def _json_num(x: Optional[float]):
    return x if x is None or math.isfinite(x) else str(x)


def _by_pair(records: Iterable[Record]) -> dict[tuple[str, str], Record]:
    out: dict[tuple[str, str], Record] = {}
    for r in records:
        out[(r.impl, r.case)] = r  # the last record of a pair wins
    return out


def classify(before: Optional[Record], after: Optional[Record], rule: GrowthRule) -> ChangeKind:
    """The kind of change from ``before`` to ``after``."""
    if after is None:
        return ChangeKind.ONLY_BEFORE
    if before is None:
        return ChangeKind.ONLY_AFTER
    if before.status != after.status:
        if after.status in FAILURES and before.status not in FAILURES:
            return ChangeKind.NEW_FAILURE
        if before.status in FAILURES and after.status == Status.PASS:
            return ChangeKind.FIXED
        return ChangeKind.STATUS_CHANGE
    if rule.grew(before.worst_ratio, after.worst_ratio):
        return ChangeKind.GROWTH
    if compile_stats.change(before, after) is not None:
        return ChangeKind.COMPILATION
    if fingerprint.change(before, after) is not None:
        return ChangeKind.COLLECTIVES
    return ChangeKind.SAME


def changes(before: Iterable[Record], after: Iterable[Record], rule: GrowthRule = DEFAULT_RULE) -> list[Change]:
    """One :class:`Change` per (impl, case) on either side, ordered by impl then case."""
    a, b = _by_pair(before), _by_pair(after)
    out = []
    for impl, case in sorted(set(a) | set(b)):
        ra, rb = a.get((impl, case)), b.get((impl, case))
        out.append(Change(impl, case, classify(ra, rb, rule), ra, rb,
                          ra.worst_ratio if ra else None, rb.worst_ratio if rb else None))
    return out


def format_changes(changes: list[Change], name_a: str, name_b: str, *, show_same: bool = False) -> str:
    """A plain-text report per implementation and kind, then a count line."""
    lines = [f"A: {name_a}", f"B: {name_b}"]
    impls = sorted({c.impl for c in changes})
    for impl in impls:
        mine = [c for c in changes if c.impl == impl]
        lines.append("")
        lines.append(f"== {impl}: {len(mine)} cases, " + ", ".join(
            f"{sum(c.kind == k for c in mine)} {k}" for k in ChangeKind if any(c.kind == k for c in mine)))
        for kind in ChangeKind:
            rows = [c for c in mine if c.kind == kind]
            if not rows or (kind is ChangeKind.SAME and not show_same):
                continue
            if kind in MISSING_ON_A_SIDE and not show_same:
                lines.append(f"  {kind} ({len(rows)}): not run on the other build (--all lists them)")
                continue
            lines.append(f"  {kind} ({len(rows)}):")
            lines.extend(f"    {c.case}  {c.describe()}" for c in rows)
    counts = {k: sum(c.kind == k for c in changes) for k in ChangeKind}
    lines.append("")
    lines.append(f"{len(changes)} (case, impl): " + ", ".join(f"{n} {k}" for k, n in counts.items() if n)
                 + f"; {sum(c.regression for c in changes)} regressions")
    return "\n".join(lines)
