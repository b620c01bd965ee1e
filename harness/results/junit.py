"""JUnit XML: one testcase per (case, impl), for CI systems that show test reports.

Rows are plain dicts (``classname``, ``name``, ``time``, ``outcome`` one of
pass/failure/error/skipped, ``message``, ``type``, ``detail``), made by
:func:`run_rows` for ``run`` and by :func:`harness.results.gate.junit_rows`
for ``gate``. A known issue is a skip whose message says "known issue" and
links it: a CI report shows it, and it fails nothing.
"""

from __future__ import annotations

import collections
import xml.etree.ElementTree as ET
from typing import Sequence

from harness.results.records import NOT_RUN, Record, Status


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
    suite = ET.Element("testsuite", name=suite_name, tests=str(len(rows)))
    counts = collections.Counter(row["outcome"] for row in rows)
    for row in rows:
        tc = ET.SubElement(suite, "testcase", classname=row["classname"], name=row["name"],
                           time=f"{float(row.get('time') or 0.0):.3f}")
        outcome = row["outcome"]
        if outcome in ("failure", "error"):
            ET.SubElement(tc, outcome, message=row.get("message") or outcome,
                          type=row.get("type") or outcome).text = row.get("detail") or ""
        elif outcome == "skipped":
            ET.SubElement(tc, "skipped", message=row.get("message") or "skipped")
    suite.set("failures", str(counts["failure"]))
    suite.set("errors", str(counts["error"]))
    suite.set("skipped", str(counts["skipped"]))
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)
