"""A build's verdict: run the selection in it, judge the records the way ``check`` does, cache the answer.

Each build is judged by ``ENV_PYTHON -m harness run --format json`` (records
kept in a store under the cache) and the verdict is ``check``'s rule over
those records (:func:`verdict_of`). A verdict is cached under a key made of
the build's identity and the selection, so a second bisection over the same
range creates nothing and runs nothing. A build that cannot be tested (``run``
exits other than 0 or 1, nothing runnable) is a SKIP. The records behind a
verdict are :class:`~harness.results.records.Record` objects, read once when
the run ends or the cache is read; a cached verdict whose records no longer
read is a cache miss.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from harness import SCHEMA_VERSION, __version__
from harness.bisect import children
from harness.bisect.bisector import Verdict
from harness.bisect.builds import Build
from harness.engine import RENDEZVOUS_ENV
from harness.paths import cache_folder
from harness.results.reader import StoreError, migrate
from harness.results.records import Record
from harness.selection import Selection

EVAL_TIMEOUT_S = 3600.0  # one `run` of the selection in one build
PROBE_TIMEOUT_S = 120.0
# A child harness finds its own environment: nothing of this one's rendezvous or virtual environment.
SCRUBBED_ENV = RENDEZVOUS_ENV + ("PYTHONHOME", "VIRTUAL_ENV")


@dataclass
class Evaluation:
    """The verdict of one build and the records behind it."""

    verdict: Verdict
    reason: str
    records: list[Record] = field(default_factory=list)
    duration_s: float = 0.0
    cached: bool = False
    python: Optional[str] = None

    def to_dict(self) -> dict:
        """The cached form: the verdict, why, the records as ``run --format json`` writes them."""
        return {"verdict": self.verdict.value, "reason": self.reason, "records": [r.to_dict() for r in self.records],
                "duration_s": self.duration_s, "python": self.python}


def verdict_of(records: Sequence[Record]) -> tuple[Verdict, str]:
    """``check``'s rule over ``run``'s records (:func:`harness.results.verdict.judge`): the verdict and why."""
    from harness.results.verdict import judge

    judgement = judge(records)
    return judgement.verdict, judgement.reason


def evaluate(python: Path, sel: Selection, store: Path, timeout: float = EVAL_TIMEOUT_S,
             extra_env: Optional[dict] = None, cwd: Optional[Path] = None) -> Evaluation:
    """Run the selection with ``python -m harness run --format json`` and judge the records.

    ``extra_env`` is added to the child's environment (an overlay's ``PYTHONPATH``); ``cwd`` is where
    it runs (``python -m`` puts that folder first on ``sys.path``).
    """
    t0 = time.monotonic()
    cmd = [str(python), "-m", "harness", "run", "--format", "json", "--store", str(store), *sel.argv()]
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
    env.update(extra_env or {})
    try:
        proc = children.run(cmd, timeout=timeout, env=env, cwd=str(cwd) if cwd else None)
    except subprocess.TimeoutExpired:
        return Evaluation(Verdict.SKIP, f"`run` took more than {timeout:.0f}s", duration_s=timeout,
                          python=str(python))
    duration = round(time.monotonic() - t0, 2)
    if "No module named harness" in proc.stderr:
        from harness.bisect.envs import harness_source_root

        root = harness_source_root() or "ROOT"
        return Evaluation(Verdict.SKIP, f"the harness is not installed in {python}: run "
                          f"`{python} -m pip install --no-deps -e {root}`", duration_s=duration, python=str(python))
    try:
        records = json.loads(proc.stdout) if proc.returncode in (0, 1) else None
    except json.JSONDecodeError:
        records = None
    if not isinstance(records, list):
        return Evaluation(Verdict.SKIP, f"`run` exited {proc.returncode}: {children.tail(proc.stderr, 2)}",
                          duration_s=duration, python=str(python))
    # The harness in that environment may be an older one: its records are read as a store's are (migrated).
    parsed = [Record.from_dict(migrate(r, f"`run` in {python}")) for r in records]
    verdict, reason = verdict_of(parsed)
    return Evaluation(verdict, reason, parsed, duration, python=str(python))


class VerdictCache:
    """One JSON file per (build identity, selection) under ``cache_root()/bisect/verdicts``."""

    def __init__(self, root: Optional[Path] = None):
        self.root = root or cache_folder("bisect") / "verdicts"

    @staticmethod
    def key(build_id: str, sel: Selection) -> str:
        parts = {"build": build_id, "selection": sel.argv(), "harness": __version__, "schema": SCHEMA_VERSION}
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]

    def get(self, key: str) -> Optional[Evaluation]:
        try:
            d = json.loads((self.root / f"{key}.json").read_text())
            records = [Record.from_dict(migrate(r, str(self.root / f"{key}.json"))) for r in d.get("records", [])]
        except (OSError, ValueError, TypeError, KeyError, AttributeError, StoreError):  # a miss: run it again
            return None
        return Evaluation(Verdict(d["verdict"]), d["reason"], records, d.get("duration_s", 0.0),
                          cached=True, python=d.get("python"))

    def put(self, key: str, build: Build, ev: Evaluation) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f"{key}.json.tmp{os.getpid()}"
        tmp.write_text(json.dumps({**ev.to_dict(), "build": build.to_dict(), "created_at": children.now()}))
        os.replace(tmp, self.root / f"{key}.json")


def interpreter_fingerprint(python: Path) -> str:
    """An existing interpreter's identity: its path and every installed distribution's version."""
    code = ("import importlib.metadata as m, json, sys; print(json.dumps([sys.version, sorted("
            "(d.metadata['Name'] or '', d.version) for d in m.distributions())]))")
    try:
        proc = children.run([str(python), "-c", code], timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"{python}:unknown"
    return hashlib.sha256(f"{os.path.realpath(python)}\0{proc.stdout}".encode()).hexdigest()[:16]


