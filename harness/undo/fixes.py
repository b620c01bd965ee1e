"""Every upstream change to SyncBatchNorm's Python since torch 1.0, as data, and each undone on the installed file.

``syncbn_fixes.toml`` beside the case catalog has one ``[[fix]]`` per change:
its pull request (``pr``, ``link``, ``title``), the defect it fixed
(``issue``), its ``kind`` (:data:`KINDS`), the first release whose file has it
(``release``) and the release before (``previous``), the ``file`` it changed,
``markers`` (a few tokens each, found in the lines it added: they pick its
hunks of the diff between the two releases' files, :mod:`harness.undo.hunks`),
what goes wrong when it is undone (``behaviour``), and optionally:

- ``edits``: ``[find, replace]`` pairs over the installed file's canonical
  text, each ``find`` occurring exactly once, for a change whose lines a later
  release rewrote (the markers then find nothing to replace): the old
  behaviour written anew over today's code;
- ``cases``: case-ID patterns the change is about, run first;
- ``uncatchable``: why no case can catch it undone (a documentation change,
  a path only two GPUs reach): the sweep still runs it, and a catch then
  contradicts the reason.

:func:`undone` gives the installed file with one change undone (markers
first, then edits), or the reason it cannot be undone on this build.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

from harness.errors import UsageError
from harness.undo import sources
from harness.undo.hunks import Undone, canonical, undo

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python < 3.11 only
    import tomli as tomllib

KINDS = ("fix", "feature", "refactor", "perf", "docs")
REQUIRED = ("pr", "link", "title", "kind", "release", "previous", "file", "markers", "behaviour")


@dataclass(frozen=True)
class Fix:
    """One upstream change to SyncBatchNorm's Python (see the module's note for each field)."""

    pr: int
    link: str
    title: str
    kind: str
    release: str
    previous: str
    file: str
    markers: tuple[str, ...]
    behaviour: str
    issue: str = ""
    edits: tuple[tuple[str, str], ...] = ()
    cases: tuple[str, ...] = ()
    uncatchable: str = ""
    note: str = ""
    extra: dict = field(default_factory=dict, compare=False, repr=False)
    id: str = ""  # set by load(): see :func:`_ids`


def default_file() -> Path:
    """``syncbn_fixes.toml`` of the case catalog."""
    from harness import cases

    return Path(cases.__file__).parent / "syncbn_fixes.toml"


def load(path: Optional[Path] = None) -> list[Fix]:
    """The entries of ``path`` (default :func:`default_file`), checked; a bad entry is a usage error naming it."""
    path = Path(path or default_file())
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{path}: {exc}") from None
    out = []
    for i, raw in enumerate(data.get("fix", []), 1):
        where = f"{path}: [[fix]] #{i} ({raw.get('link', 'no link')})"
        missing = [k for k in REQUIRED if k not in raw]
        if missing:
            raise UsageError(f"{where} lacks {', '.join(missing)}")
        if raw["kind"] not in KINDS:
            raise UsageError(f"{where}: kind {raw['kind']!r} is not one of {', '.join(KINDS)}")
        if raw["file"] not in sources.FILES:
            raise UsageError(f"{where}: file {raw['file']!r} is not one of {', '.join(sources.FILES)}")
        edits = tuple(tuple(e) for e in raw.get("edits", ()))
        if any(len(e) != 2 or not all(isinstance(x, str) for x in e) for e in edits):
            raise UsageError(f"{where}: edits are [find, replace] pairs of strings")
        known = set(REQUIRED) | {"issue", "edits", "cases", "uncatchable", "note"}
        out.append(Fix(pr=int(raw["pr"]), link=raw["link"], title=raw["title"], kind=raw["kind"],
                       release=raw["release"], previous=raw["previous"], file=raw["file"],
                       markers=tuple(raw["markers"]), behaviour=raw["behaviour"], issue=raw.get("issue", ""),
                       edits=edits, cases=tuple(raw.get("cases", ())), uncatchable=raw.get("uncatchable", ""),
                       note=raw.get("note", ""), extra={k: v for k, v in raw.items() if k not in known}))
    return _ids(out)


def _ids(entries: list[Fix]) -> list[Fix]:
    """Each entry named once: ``pr<N>``; ``pr<N>-<k>`` where a pull request made several entries (k in file
    order); ``<release>-<k>`` for entries with no pull request."""
    count: dict[str, int] = {}
    for f in entries:
        base = f"pr{f.pr}" if f.pr else f.release
        count[base] = count.get(base, 0) + 1
    seen: dict[str, int] = {}
    out = []
    for f in entries:
        base = f"pr{f.pr}" if f.pr else f.release
        seen[base] = seen.get(base, 0) + 1
        ident = base if count[base] == 1 and f.pr else f"{base}-{seen[base]}"
        out.append(replace(f, id=ident))
    return out


def apply_edits(text: str, edits) -> Undone:
    """``text`` (canonical) with each ``[find, replace]`` done once; a ``find`` not there once is the reason."""
    for find, by in edits:
        n = text.count(find)
        if n != 1:
            return Undone(None, 0, f"the edit's text {find!r} is {'not' if n == 0 else f'{n} times'} in the "
                                   f"installed file's canonical text")
        text = text.replace(find, by)
    return Undone(text, len(edits))


def undone(fix: Fix, installed: str, folder: Optional[Path] = None) -> tuple[Undone, str]:
    """The installed text of ``fix.file`` with ``fix`` undone, and how (``markers`` or ``edits``)."""
    before = sources.release_file(fix.previous, fix.file, folder)
    after = sources.release_file(fix.release, fix.file, folder)
    by_markers = undo(installed, before, after, fix.markers)
    if by_markers.ok or not fix.edits:
        return by_markers, "markers"
    by_edits = apply_edits(canonical(installed), fix.edits)
    if by_edits.ok:
        return by_edits, "edits"
    return Undone(None, 0, f"{by_markers.reason}; and {by_edits.reason}"), "edits"
