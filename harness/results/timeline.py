"""Timelines: the builds of one overlay bisection in the order of their commits on the branch.

A store's builds are files named by version and commit (``store.build_key``),
which sort by hash, not by history. An overlay bisection knows the order: it
writes ``timeline-<good>-<bad>.json`` into the store it ran with
(:func:`write`)::

    {"checkout": "/src/pytorch", "kind": "python",
     "commits": [{"commit": "<40 hex>", "label": "<12 hex> <subject>", "verdict": "good" | "bad" | "skip" | null,
                  "approximate": "approximate: ..." | null, "untestable": "..." | null}, ...]}

oldest first. :func:`order` sorts a report's builds by it (:func:`rows` over a
report's records frame): the builds of each
timeline in their commits' order (timelines by their first commit's file
time, oldest first), then every other build by key; :func:`label` marks an
approximate build. A timeline that does not parse is ignored (the report
still lists its builds, by key): it is derived data, and the records stay the
truth.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Iterable, Optional

PATTERN = "timeline-*.json"
_OVERLAY = re.compile(r"^overlay of ([0-9a-f]+) on ")


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


def commit_of(torch_git_version: str) -> Optional[str]:
    """The overlaid commit of ``overlay of <commit> on ...``, else None."""
    m = _OVERLAY.match(torch_git_version or "")
    return m.group(1) if m else None


def order(builds: Iterable[tuple[str, str]], timelines: list[dict]) -> list[str]:
    """Build keys in timeline order: ``builds`` are ``(key, torch_git_version)`` pairs."""
    position: dict[str, tuple[int, int]] = {}
    for t, line in enumerate(timelines):
        for i, c in enumerate(line["commits"]):
            position.setdefault(c["commit"], (t, i))
    keys = dict(builds)
    placed = sorted((position[commit_of(gv)], key) for key, gv in keys.items() if commit_of(gv) in position)
    rest = sorted(key for key, gv in keys.items() if commit_of(gv) not in position)
    return [key for _, key in placed] + rest


def label(key: str, torch_git_version: str) -> str:
    """The build's name in a report: its key, ``~`` after it when its overlay left compiled files out."""
    return key + (" ~" if "(approximate:" in (torch_git_version or "") else "")


def rows(df, store_dir) -> list[tuple[str, str]]:
    """``(build key, shown name)`` for a report's records frame (columns ``build``, ``torch_git_version``), in
    :func:`order`, each named by :func:`label`."""
    if df.empty:
        return []
    builds = df[["build", "torch_git_version"]].drop_duplicates("build")
    pairs = {b: str(gv) for b, gv in builds.itertuples(index=False)}
    return [(key, label(key, pairs[key])) for key in order(pairs.items(), load(store_dir))]
