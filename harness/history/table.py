"""The history as one small table: a row per (release, implementation, case), kept beside its page.

A history store holds every record whole (5 MB a release); what the page,
the known issues' ranges and their test need of it is far less: the status,
the failures as :mod:`harness.results.symptoms` words them, the known issue
that matched, and the head of the message. :func:`rows_from_store` reads the
latest record of each (implementation, case) of every release the manifest
stored; :func:`write` and :func:`read` keep the rows as gzipped JSON Lines
(``history.jsonl.gz``, a few hundred kB for sixteen releases), with the
manifest's per-release outcomes as its first line, so that the page and the
test of the ranges work from one committed file and never need the store.
Nothing machine-specific is written: the manifest's log paths are cut to
their file names.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

from packaging.version import Version

from harness.history.collect import ReleaseOutcome, read_manifest, release_records
from harness.results import symptoms

MESSAGE_CHARS = 240


@dataclass(frozen=True)
class Row:
    """One (release, implementation, case) of the history: what happened, in words."""

    release: str
    impl: str
    case: str
    family: str
    status: str
    failures: tuple[str, ...] = ()
    known: str = ""  # the link of the known issue that matched when it ran ("" none); the page asks the file anew
    now_passes: bool = False  # a known issue covers the case and it passed
    message: str = ""
    mode: str = ""
    device: str = "cpu"
    torch_version: str = ""


@dataclass
class History:
    """The rows, and what happened to each release (stored, or failed and why)."""

    releases: dict[str, ReleaseOutcome]
    rows: list[Row]

    def ordered_releases(self) -> list[str]:
        """Every release the history tried, oldest first."""
        return sorted(self.releases, key=Version)

    def stored(self) -> list[str]:
        """The releases whose records are in the history, oldest first."""
        return [r for r in self.ordered_releases() if self.releases[r].status == "stored"]


def rows_from_store(store: Path) -> History:
    """The history of ``store``: its manifest's releases and the latest record of each of their cases."""
    outcomes = read_manifest(store)
    rows: list[Row] = []
    for release in outcomes:
        _key, records = release_records(store, release)
        for r in records:
            rows.append(Row(release=release, impl=r.impl, case=r.case, family=r.family, status=r.status.value,
                            failures=tuple(symptoms.failures(r)),
                            known=r.known_issue.link if r.known_issue and r.known_issue.matched else "",
                            now_passes=bool(r.known_issue and r.known_issue.now_passes),
                            message=r.message[:MESSAGE_CHARS], mode=r.mode.value if r.mode else "", device=r.device,
                            torch_version=r.torch_version))
    rows.sort(key=lambda x: (Version(x.release), x.impl, x.case))
    return History(outcomes, rows)


def _public(outcome: ReleaseOutcome) -> dict:
    d = outcome.to_dict()
    d["reason"] = " ".join(w if "/" not in w or w.startswith("http") else Path(w.rstrip("):,")).name
                           for w in d["reason"].split())
    return d


def write(path: Path, history: History) -> Path:
    """Write the history to ``path`` (gzipped JSON Lines: the releases first, then one row a line)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"releases": {r: _public(history.releases[r]) for r in history.ordered_releases()}})]
    lines += [json.dumps(asdict(row)) for row in history.rows]
    # mtime=0: the same history gives the same bytes, so git sees a change only when the history changed.
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
        f.write(("\n".join(lines) + "\n").encode())
    return path


def read(path: Path) -> History:
    """The history :func:`write` wrote."""
    with gzip.open(path, "rt") as f:
        head = json.loads(f.readline())
        rows = [Row(**{**d, "failures": tuple(d["failures"])}) for d in map(json.loads, _lines(f))]
    releases = {r: ReleaseOutcome(**d) for r, d in head["releases"].items()}
    return History(releases, rows)


def _lines(f) -> Iterable[str]:
    return (line for line in f if line.strip())
