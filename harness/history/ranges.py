"""Each known issue's releases: where the history shows it, against the range its entry states (pure).

An entry *shows* on a release when a record of that release is one the entry
covers, whatever its ``torch`` specifier says (the specifier is a claim to be
checked, not a filter here), has one of the entry's expected statuses, and
fails at least one way the entry's ``symptoms`` name. :func:`observed` lists
those releases; :func:`disagreements` compares them with the entry's
``releases`` (first and last release where it shows) and its ``torch``
specifier, one sentence per disagreement:
- the stated first or last release is not the observed one;
- the history shows the issue on a release between them and not on another
  (a gap: fixed, then back), which a range cannot state;
- the specifier leaves out a release where the issue shows (its records would
  not be marked known) or admits a stored release of the history where it
  does not show though its cases ran.

An entry whose defect the history cannot see (a third-party implementation
not installed in the history's environments, a CUDA-only defect) states why
instead of a range; it disagrees when the history shows it after all.
"""

from __future__ import annotations

import fnmatch
from dataclasses import replace
from typing import Sequence

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from harness.history.table import History, Row
from harness.results.known_issues import KnownIssue, explain
from harness.judge.status import FAILURES
from harness.judge.status import NOT_RUN as NOT_RUN_STATUSES

FAILED = frozenset(s.value for s in FAILURES)
NOT_RUN = frozenset(s.value for s in NOT_RUN_STATUSES)


def covers(entry: KnownIssue, row: Row) -> bool:
    """Whether ``entry`` covers the row's (impl, case, device, mode), whatever its torch specifier."""
    return replace(entry, torch=SpecifierSet()).covers(row.impl, row.case, Version(row.torch_version or row.release),
                                                      row.device, row.mode)


def shows(entry: KnownIssue, row: Row) -> bool:
    """Whether the row is this entry's defect: covered, an expected status, a failure its symptoms name."""
    return (row.status in entry.status and covers(entry, row)
            and any(fnmatch.fnmatchcase(f, p) for f in row.failures for p in entry.symptoms))


def known(row: Row, entries: tuple[KnownIssue, ...]) -> bool:
    """Whether the known-issues entries explain the row's failure now, as a run annotates a record: the entries
    covering it (torch specifier included) that expect its status name every one of its failures."""
    if row.status not in FAILED or not row.failures:
        return False
    version = Version(row.torch_version or row.release)
    found = [e for e in entries if e.covers(row.impl, row.case, version, row.device, row.mode)]
    expecting, unexplained = explain(found, row.status, row.failures)
    return bool(expecting) and not unexplained


def observed(entry: KnownIssue, history: History) -> list[str]:
    """The stored releases where the entry shows, oldest first."""
    hits = {row.release for row in history.rows if shows(entry, row)}
    return [r for r in history.stored() if r in hits]


def ran(entry: KnownIssue, history: History) -> list[str]:
    """The stored releases where at least one case the entry covers ran (was not skipped or unsupported)."""
    hits = {row.release for row in history.rows
            if row.status not in NOT_RUN and covers(entry, row)}
    return [r for r in history.stored() if r in hits]


def stated_range(releases: Sequence[str]) -> str:
    """``1.13.1..2.14.1`` (or one release), as the page and the messages write a range."""
    return f"{releases[0]}..{releases[-1]}" if len(releases) > 1 else releases[0]


def disagreements(entry: KnownIssue, history: History) -> list[str]:
    """How the entry's stated releases and specifier disagree with the history (empty: they agree)."""
    seen = observed(entry, history)
    stored = history.stored()
    out = []
    if entry.releases is None:
        if seen:
            out.append(f"states the history cannot show it ({entry.history_note}), but it shows on "
                       f"{', '.join(seen)}: give releases = [\"{seen[0]}\", \"{seen[-1]}\"]")
        return out
    first, last = entry.releases
    if not seen:
        out.append(f"states releases {first}..{last}, but the history shows it on none of {len(stored)} stored "
                   f"releases (its cases ran on {', '.join(ran(entry, history)) or 'none'})")
        return out
    if (first, last) != (seen[0], seen[-1]):
        out.append(f"states releases {first}..{last}; the history shows {stated_range(seen)}: give "
                   f"releases = [\"{seen[0]}\", \"{seen[-1]}\"]")
    inside = stored[stored.index(seen[0]):stored.index(seen[-1]) + 1]
    gaps = [r for r in inside if r not in seen and r in ran(entry, history)]
    if gaps:
        out.append(f"shows on {stated_range(seen)} but not on {', '.join(gaps)} between: a range cannot say that")
    left_out = [r for r in seen if not entry.torch.contains(Version(r), prereleases=True)]
    if left_out:
        out.append(f"torch = {str(entry.torch)!r} leaves out {', '.join(left_out)}, where it shows")
    ran_on = set(ran(entry, history))
    admitted = [r for r in stored if r not in seen and r in ran_on and entry.torch.contains(Version(r))
                and not (Version(seen[0]) < Version(r) < Version(seen[-1]))]
    if admitted:
        out.append(f"torch = {str(entry.torch)!r} admits {', '.join(admitted)}, where its cases ran and it "
                   "does not show")
    return out
