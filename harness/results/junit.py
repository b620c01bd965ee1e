"""JUnit XML: one testcase per (case, impl), for CI systems that show test reports.

Rows are plain dicts (``classname``, ``name``, ``time``, ``outcome`` one of
pass/failure/error/skipped, ``message``, ``type``, ``detail``), made by
:func:`run_rows` for ``run`` and by :func:`harness.results.gate.junit_rows`
for ``gate``. A known issue is a skip whose message says "known issue" and
links it: a CI report shows it, and it fails nothing.

Every text that reaches the file goes through :func:`xml_text` first: a
character XML 1.0 cannot hold (NUL and the other C0 controls but tab, newline
and carriage return; lone surrogates; U+FFFE, U+FFFF) becomes a visible
escape (``\\x1b``, ``\\ud800``), as pytest does, so an ANSI colour code or a NUL
in an exception message never makes a file a CI server refuses. A message
attribute is cut to :data:`MAX_MESSAGE` characters and a detail text to
:data:`MAX_DETAIL` (the record in the store keeps them whole).
"""

from __future__ import annotations

import collections
import re
import xml.etree.ElementTree as ET
from typing import Sequence

from harness.judge.status import NOT_RUN, Status
from harness.results.records import Record

MAX_MESSAGE = 4096
MAX_DETAIL = 65536
_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _escape(m: re.Match) -> str:
    c = ord(m.group(0))
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def xml_text(text: object, limit: int = 0) -> str:
    """``text`` with every character XML 1.0 cannot hold escaped visibly; cut to ``limit`` characters if set."""
    s = _ILLEGAL.sub(_escape, str(text if text is not None else ""))
    if limit and len(s) > limit:
        s = s[:limit] + f"... ({len(s) - limit} more characters; the store has the whole text)"
    return s


def detail(record: Record) -> str:
    """Every rank's outcome, one line each."""
    return "\n".join(o.line() for o in record.ranks)


def run_rows(records: Sequence[Record]) -> list[dict]:
    """A run's testcases: failures and errors carry the message and the rank attribution."""
    rows = []
    for r in records:
        row = {"classname": r.impl, "name": r.case, "time": r.duration_s, "outcome": "pass"}
        if r.known:
            row.update(outcome="skipped", message=f"known issue {r.known_issue.link}: {r.status.value} as expected: "
                                                   f"{r.message}")
        elif r.status in (Status.MISMATCH, Status.CRASH, Status.HANG):
            row.update(outcome="failure", message=r.message or r.status.value, type=r.status.value, detail=detail(r))
        elif r.status == Status.ERROR:
            row.update(outcome="error", message=r.message or "error", type="error", detail=detail(r))
        elif r.status in NOT_RUN:
            row.update(outcome="skipped", message=f"{r.status.value}: {r.message}")
        rows.append(row)
    return rows


def write(rows: Sequence[dict], path: str, suite_name: str = "syncbn-harness") -> None:
    """Write ``rows`` as a JUnit XML test suite to ``path``."""
    suite = ET.Element("testsuite", name=xml_text(suite_name), tests=str(len(rows)))
    counts = collections.Counter(row["outcome"] for row in rows)
    for row in rows:
        tc = ET.SubElement(suite, "testcase", classname=xml_text(row["classname"]), name=xml_text(row["name"]),
                           time=f"{float(row.get('time') or 0.0):.3f}")
        outcome = row["outcome"]
        if outcome in ("failure", "error"):
            ET.SubElement(tc, outcome, message=xml_text(row.get("message") or outcome, MAX_MESSAGE),
                          type=xml_text(row.get("type") or outcome)).text = xml_text(row.get("detail"), MAX_DETAIL)
        elif outcome == "skipped":
            ET.SubElement(tc, "skipped", message=xml_text(row.get("message") or "skipped", MAX_MESSAGE))
    suite.set("failures", str(counts["failure"]))
    suite.set("errors", str(counts["error"]))
    suite.set("skipped", str(counts["skipped"]))
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)
