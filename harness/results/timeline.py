"""Timelines: the builds of one overlay bisection in the order of their commits on the branch.

A store's builds are files named by version and commit (``store.build_key``),
which sort by hash, not by history. An overlay bisection knows the order: it
writes ``timeline-<good>-<bad>.json`` into the store it ran with
(:func:`write`)::

    {"checkout": "/src/pytorch", "kind": "python",
     "commits": [{"commit": "<40 hex>", "label": "<12 hex> <subject>", "verdict": "good" | "bad" | "skip" | null,
                  "approximate": "approximate: ..." | null, "untestable": "..." | null}, ...]}

oldest first. :func:`order` sorts a report's builds by it (:func:`rows` over a
report's frame of builds): the builds of each timeline in their commits'
order (timelines by their first commit's file time, oldest first), then
every other build by key; :func:`label` marks an approximate build. A
build's commit and how approximate it is come from its records' ``overlay``
field (:class:`~harness.results.records.Overlay`), never from the words of
its git version. A timeline that does not parse is ignored (the report
still lists its builds, by key): it is derived data, and the records stay the
truth.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Optional

PATTERN = "timeline-*.json"


def write(store_dir: Path, timeline: dict) -> Path:
    """Write ``timeline`` into ``store_dir`` (atomically: aside, then renamed); returns its path."""
    commits = timeline["commits"]
    path = Path(store_dir) / f"timeline-{commits[0]['commit'][:12]}-{commits[-1]['commit'][:12]}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(timeline, indent=1))
    os.replace(tmp, path)
    return path


def load(store_dir: Path) -> list[dict]:
    """The timelines in ``store_dir``, oldest file first; unreadable ones left out."""
    out = []
    for path in sorted(Path(store_dir).glob(PATTERN), key=lambda p: (p.stat().st_mtime, p.name)):
        try:
            d = json.loads(path.read_text())
            if isinstance(d.get("commits"), list) and all(isinstance(c.get("commit"), str) for c in d["commits"]):
                out.append(d)
        except (OSError, ValueError, AttributeError):
            continue
    return out


def order(builds: Iterable[tuple[str, Optional[str]]], timelines: list[dict]) -> list[str]:
    """Build keys in timeline order: ``builds`` are ``(key, overlaid commit)`` pairs (None: not an overlay)."""
    position: dict[str, tuple[int, int]] = {}
    for t, line in enumerate(timelines):
        for i, c in enumerate(line["commits"]):
            position.setdefault(c["commit"], (t, i))
    commits = dict(builds)
    placed = sorted((position[commit], key) for key, commit in commits.items() if commit in position)
    rest = sorted(key for key, commit in commits.items() if commit not in position)
    return [key for _, key in placed] + rest


def label(key: str, left_out: int) -> str:
    """The build's name in a report: its key, ``~`` after it when its overlay left compiled files out."""
    return key + (" ~" if left_out else "")


def rows(df, store_dir) -> list[tuple[str, str]]:
    """``(build key, shown name)`` for a report's frame of builds (columns ``build``, ``overlay_commit``,
    ``left_out``: :class:`harness.results.page.Page`'s ``builds``), in :func:`order`, each named by
    :func:`label`."""
    if df.empty:
        return []
    builds = df[["build", "overlay_commit", "left_out"]].drop_duplicates("build")
    commits = {b: (c if isinstance(c, str) and c else None) for b, c, _ in builds.itertuples(index=False)}
    left_out = {b: int(n or 0) for b, _, n in builds.itertuples(index=False)}
    return [(key, label(key, left_out[key])) for key in order(commits.items(), load(store_dir))]
