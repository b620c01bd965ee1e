"""Every change of a case's status between two consecutive releases of the history, and what explains it (pure).

For each (implementation, case) and each pair of consecutive stored releases
where its status differs, :func:`status_changes` names the explanation, in
this order:
0. a side where the case did not run (skipped or unsupported): its record's
   reason (``torch.compile`` before 2.0, say), which is the harness's own
   account, not torch's behaviour;
1. an upstream change of ``torch_changes.toml`` (:mod:`harness.history.fixes`)
   that concerns the case, whose statuses match, released in between;
2. a known issue that shows on one side and not the other
   (:mod:`harness.history.ranges`): it begins or ends there; or one that
   shows on both sides with different statuses (gloo aborting where it used
   to raise, say): the same defect, another of its symptoms;
3. otherwise ``unexplained``.
:func:`grouped` folds them into one line per (releases, implementation,
statuses, explanation), with a count and an example case, as the page shows
them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from packaging.version import Version

from harness.history import ranges
from harness.history.fixes import Change, explain
from harness.history.ranges import NOT_RUN
from harness.history.table import History, Row
from harness.results.known_issues import KnownIssue


@dataclass(frozen=True)
class StatusChange:
    """One case's status change between two consecutive stored releases, and what explains it."""

    before: Row
    after: Row
    explanation: str  # a link, with what it is
    explained: bool


def _explain(before: Row, after: Row, changes: list[Change], entries: tuple[KnownIssue, ...]) -> tuple[str, bool]:
    for side in (before, after):
        if side.status in NOT_RUN:  # the record says why the case could not run on that release
            return f"not run on {side.release}: {side.message}", True
    change = explain(before, after, changes)
    if change is not None:
        return (f"{change.name} {change.title} ({change.link})" if change.pr is not None
                else f"{change.title} ({change.link})"), True
    for entry in entries:
        was, now = ranges.shows(entry, before), ranges.shows(entry, after)
        if was != now:
            return f"known issue {'ends' if was else 'begins'}: {entry.link}", True
    for entry in entries:
        if ranges.shows(entry, before) and ranges.shows(entry, after):
            return f"one known issue, another of its symptoms: {entry.link}", True
    return "unexplained", False


def status_changes(history: History, changes: list[Change], entries: tuple[KnownIssue, ...]) -> list[StatusChange]:
    """Every status change between consecutive stored releases, each with its explanation."""
    stored = history.stored()
    by_case: dict[tuple[str, str], dict[str, Row]] = {}
    for row in history.rows:
        by_case.setdefault((row.impl, row.case), {})[row.release] = row
    out = []
    for (_impl, _case), by_release in sorted(by_case.items()):
        for prev, cur in zip(stored, stored[1:]):
            a, b = by_release.get(prev), by_release.get(cur)
            if a is None or b is None or a.status == b.status:
                continue
            text, ok = _explain(a, b, changes, entries)
            out.append(StatusChange(a, b, text, ok))
    return out


@dataclass(frozen=True)
class Group:
    """Status changes folded: the releases, the implementation, the statuses, the explanation; how many cases."""

    before: str
    after: str
    impl: str
    was: str
    now: str
    explanation: str
    count: int
    example: str


def grouped(found: list[StatusChange]) -> list[Group]:
    """One :class:`Group` per (releases, implementation, statuses, explanation), in release order; its example
    is the first case of the group."""
    counts: Counter = Counter()
    first: dict = {}
    order = []
    for c in found:
        key = (c.before.release, c.after.release, c.after.impl, c.before.status, c.after.status, c.explanation)
        if key not in counts:
            order.append(key)
            first[key] = c.after.case
        counts[key] += 1
    order.sort(key=lambda k: (Version(k[0]), k[2], k[3], k[4], k[5]))
    return [Group(*key, count=counts[key], example=first[key]) for key in order]
