"""Known issues: a data file (cases/known_issues.toml) of upstream defects, matched to records.

Protocol: :func:`annotate` sets ``record.known_issue`` when an entry matches the
record's implementation, case ID (shell-style patterns) and torch version
(a PEP 440 specifier):
- the record has the entry's expected status: ``{"matched": True, ...}``; the
  failure is expected and does not fail ``run``/``check``/``gate``;
- the record passes: ``{"matched": False, "now_passes": True, ...}``; reported
  so the entry can be retired;
- any other status: ``{"matched": False, ...}``; a different failure is a real one.
"""

from __future__ import annotations

import fnmatch
import sys
from functools import lru_cache
from pathlib import Path
from typing import Optional

from harness.errors import UsageError
from harness.records import Record, Status

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python < 3.11 only
    import tomli as tomllib

REQUIRED = ("impl", "cases", "torch", "status", "link")


def default_path() -> Path:
    from harness import cases

    return Path(cases.__file__).with_name("known_issues.toml")


@lru_cache(maxsize=8)
def load(path: Optional[str] = None) -> tuple:
    """The entries of a known-issues file, validated."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    p = Path(path) if path else default_path()
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"known-issues file {p} cannot be read: {exc}") from None
    entries = []
    for i, e in enumerate(data.get("issue", [])):
        missing = [k for k in REQUIRED if k not in e]
        if missing:
            raise UsageError(f"{p}: issue #{i + 1} lacks {', '.join(missing)} (needs {', '.join(REQUIRED)})")
        try:
            spec = SpecifierSet(e["torch"])
        except InvalidSpecifier:
            raise UsageError(f"{p}: issue #{i + 1} torch = {e['torch']!r} is not a version specifier "
                             "(e.g. '>=1.12,<2.15')") from None
        statuses = e["status"] if isinstance(e["status"], list) else [e["status"]]
        for s in statuses:
            try:
                Status(s)
            except ValueError:
                raise UsageError(f"{p}: issue #{i + 1} status {s!r} is not one of "
                                 f"{', '.join(x.value for x in Status)}") from None
        patterns = e["cases"] if isinstance(e["cases"], list) else [e["cases"]]
        entries.append({**e, "cases": tuple(patterns), "status": tuple(statuses), "_spec": spec})
    return tuple(entries)


def match(impl: str, case: str, torch_version: str, path: Optional[str] = None) -> Optional[dict]:
    """The first entry for (impl, case, torch version), or None."""
    from packaging.version import InvalidVersion, Version

    try:
        version = Version(torch_version)
    except InvalidVersion:
        return None
    for e in load(path):
        if e["impl"] != impl or not any(fnmatch.fnmatchcase(case, p) for p in e["cases"]):
            continue
        if e["_spec"].contains(version, prereleases=True):
            return e
    return None


def annotate(record: Record, path: Optional[str] = None) -> Record:
    """Set ``record.known_issue`` from the known-issues file (see the module docstring)."""
    e = match(record.impl, record.case, record.torch_version, path)
    if e is None:
        return record
    info = {"link": e["link"], "expected": list(e["status"]), "note": e.get("note", "").strip(),
            "matched": record.status.value in e["status"]}
    if record.status == Status.PASS:
        info["now_passes"] = True
    record.known_issue = info
    return record
