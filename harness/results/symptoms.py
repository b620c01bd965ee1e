"""A record's failures, each in one line of words a known-issue entry can name (pure).

A failed record can fail in several ways at once: two tensors out of
tolerance, an error on one rank and a crash on another. A known issue
explains a record only when it explains every one of them, so that a second
defect landing on a case that already fails as known is still seen. Each way
is one *symptom*, a line that starts with its kind:

- ``mismatch <tensor>``: a compared tensor out of tolerance, named as the
  record's metrics name it without the rank (``step1.train.running_var``,
  ``convert.00``), followed by ``: <problem>`` where the judge said what is
  structurally wrong (``convert.00: one module registered as shared and
  stages.1.norm became 2 modules``);
- ``error <ExceptionType>: <first line of the message>``: a rank raised;
- ``crash <SIGNAL>`` (or ``crash exit <code>``): a rank died;
- ``hang``: a rank did not answer in time;
- ``<status>: <message>``: a failed record whose ranks and tensors say
  nothing more (a collective desync found in the parent, say).

Ranks stopped because a sibling failed (``peer-failed``) are consequences, not
symptoms. The same symptom on several ranks is one symptom. An entry's
``symptoms`` are shell-style patterns over these lines (:func:`unexplained`).
"""

from __future__ import annotations

import fnmatch
import re
from typing import Iterable

from harness.judge.status import FAILURES, RankStatus, Status
from harness.results.records import Record

_RANK_PREFIX = re.compile(r"^rank\d+\.")
KINDS = tuple(s.value for s in Status if s in FAILURES)  # what a symptom line starts with: mismatch, error, ...


def failures(record: Record) -> tuple[str, ...]:
    """The record's symptoms, in a stable order (see the module docstring); none for a record that did not fail."""
    if record.status not in FAILURES:
        return ()
    seen: dict[str, None] = {}
    for key in sorted(record.metrics):
        m = record.metrics[key]
        if m.ok:
            continue
        tensor = _RANK_PREFIX.sub("", key)
        seen[f"mismatch {tensor}" + (f": {' '.join(m.problem.split())}" if m.problem else "")] = None
    for r in record.ranks:
        if r.status == RankStatus.ERROR:
            first = (r.message or "").strip().splitlines()[:1]
            seen[f"error {r.exception_type or 'Exception'}: {first[0] if first else ''}".rstrip()] = None
        elif r.status == RankStatus.CRASH:
            seen[f"crash {r.signal}" if r.signal else f"crash exit {r.exit_code}"] = None
        elif r.status == RankStatus.HANG:
            seen["hang"] = None
    if not seen:
        first = (record.message or "").strip().splitlines()[:1]
        seen[f"{record.status.value}: {first[0] if first else ''}".rstrip()] = None
    return tuple(seen)


def unexplained(symptoms: Iterable[str], patterns: Iterable[str]) -> tuple[str, ...]:
    """The symptoms no pattern matches (shell-style, case-sensitive)."""
    patterns = tuple(patterns)
    return tuple(s for s in symptoms if not any(fnmatch.fnmatchcase(s, p) for p in patterns))


def check_pattern(pattern: str) -> str:
    """Why ``pattern`` cannot name a symptom (it must start with a kind), or ''."""
    head = pattern.split(" ", 1)[0].rstrip(":")
    if head not in KINDS:
        return f"{pattern!r} does not start with one of {', '.join(KINDS)} (e.g. 'mismatch step*.train.running_var')"
    return ""
