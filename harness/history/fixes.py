"""Upstream changes with a known release, and whether the history shows each at that release.

The data file ``torch_changes.toml`` beside the case catalog lists torch pull
requests that change what the harness sees of SyncBN: a fix (an error or a
wrong value that goes away) or a capability (``torch.compile`` appearing).
Each ``[[change]]`` names its pull request (``pr``, ``link``, ``title``; a
change with no single pull request gives its release notes as ``link``),
the first release that contains it (``release``, from the tags that contain
its commit), the implementations and cases it concerns (shell-style
patterns), and the statuses of those cases before and after it. Optionally
``verdict``: what an investigation found where the history disagrees (a
backport, a second change in the same release), so that the disagreement is
explained, not hidden.

:func:`check` finds, for each change, the first stored release at which the
concerned cases left ``before`` for ``after`` (the observed release), and
compares it with the first stored release at or after ``release`` (the
expected one). :func:`explain` says which change explains a status change
between two releases of the history.
"""

from __future__ import annotations

import fnmatch
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from packaging.version import InvalidVersion, Version

from harness.errors import UsageError
from harness.history.table import History, Row

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python < 3.11 only
    import tomli as tomllib

REQUIRED = ("link", "title", "release", "impl", "cases", "before", "after")


@dataclass(frozen=True)
class Change:
    """One upstream change: its pull request, its first release, and what it changes in which cases."""

    pr: Optional[int]  # None: a change with no single pull request (release notes, a feature)
    link: str
    title: str
    release: str
    impl: tuple[str, ...]
    cases: tuple[str, ...]
    before: tuple[str, ...]
    after: tuple[str, ...]
    note: str = ""
    verdict: str = ""  # what the investigation of a disagreement found

    @property
    def name(self) -> str:
        """``#98332``, or the title where there is no single pull request."""
        return f"#{self.pr}" if self.pr is not None else self.title

    def concerns(self, row: Row) -> bool:
        """Whether the row is one of this change's (impl, case)."""
        return (any(fnmatch.fnmatchcase(row.impl, p) for p in self.impl)
                and any(fnmatch.fnmatchcase(row.case, p) for p in self.cases))


def default_path() -> Path:
    from harness import cases

    return Path(cases.__file__).with_name("torch_changes.toml")


def load(path: Optional[Path] = None) -> list[Change]:
    """The changes of the data file, validated (a bad entry is a usage error naming it and the fix)."""
    p = Path(path) if path else default_path()
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"upstream changes file {p} cannot be read: {exc}") from None
    out = []
    for i, e in enumerate(data.get("change", [])):
        missing = [k for k in REQUIRED if k not in e]
        if missing:
            raise UsageError(f"{p}: change #{i + 1} lacks {', '.join(missing)} (needs {', '.join(REQUIRED)})")
        try:
            Version(e["release"])
        except InvalidVersion:
            raise UsageError(f"{p}: change #{i + 1} release = {e['release']!r} is not a version (e.g. \"2.1.0\")") \
                from None
        lists = {k: tuple(e[k] if isinstance(e[k], list) else [e[k]]) for k in ("impl", "cases", "before", "after")}
        out.append(Change(pr=int(e["pr"]) if "pr" in e else None, link=e["link"], title=e["title"],
                          release=e["release"], **lists,
                          note=" ".join(str(e.get("note", "")).split()),
                          verdict=" ".join(str(e.get("verdict", "")).split())))
    return out


@dataclass(frozen=True)
class Check:
    """A change against the history: the release expected to show it, the one that does, and the verdict."""

    change: Change
    expected: Optional[str]  # the first stored release at or after the change's release
    observed: Optional[str]  # the first stored release where its cases left `before` for `after`
    cases: int  # how many of its cases changed there

    @property
    def agrees(self) -> bool:
        """The history shows the change at the first stored release that contains it."""
        return self.expected is not None and self.expected == self.observed

    @property
    def verdict(self) -> str:
        """``agrees``, the recorded investigation, or ``unexplained``."""
        if self.agrees:
            return "agrees"
        return self.change.verdict or "unexplained"


def check(change: Change, history: History) -> Check:
    """Where the history shows ``change`` (see the module docstring)."""
    stored = history.stored()
    expected = next((r for r in stored if Version(r).release[:2] >= Version(change.release).release[:2]
                     and Version(r) >= Version(Version(change.release).base_version)), None)
    statuses: dict[tuple[str, str], dict[str, str]] = {}
    for row in history.rows:
        if change.concerns(row):
            statuses.setdefault((row.impl, row.case), {})[row.release] = row.status
    for prev, cur in zip(stored, stored[1:]):
        moved = sum(1 for by in statuses.values()
                    if by.get(prev) in change.before and by.get(cur) in change.after)
        if moved:
            return Check(change, expected, cur, moved)
    return Check(change, expected, None, 0)


def explain(row_before: Row, row_after: Row, changes: list[Change]) -> Optional[Change]:
    """The change that explains a case's status change between two consecutive stored releases, if one does:
    it concerns the case, its statuses match, and its release lies in (before, after]."""
    lo, hi = Version(row_before.release), Version(row_after.release)
    for c in changes:
        at = Version(c.release)
        if (c.concerns(row_after) and row_before.status in c.before and row_after.status in c.after
                and lo.release[:2] < at.release[:2] <= hi.release[:2]):
            return c
    return None
