"""Human and machine output of a run: the summary table and JUnit XML (shared with `gate`)."""

from __future__ import annotations

import collections
import xml.etree.ElementTree as ET
from typing import Sequence

import click

from harness.records import Record, Status


def worst_ratio(record: Record):
    """The largest error/tolerance ratio among a record's metrics (None if none)."""
    ratios = [m.get("ratio") for m in record.metrics.values() if isinstance(m.get("ratio"), (int, float))]
    return max(ratios) if ratios else None


def print_table(records: Sequence[Record]) -> None:
    """One line per record, then counts per status (to stdout)."""
    if not records:
        click.echo("no records")
        return
    w_case = max(len(r.case) for r in records)
    w_impl = max(len(r.impl) for r in records)
    click.echo(f"{'case':<{w_case}}  {'impl':<{w_impl}}  {'status':<11}  {'err/tol':>8}  {'time':>6}  message")
    for r in records:
        ratio = worst_ratio(r)
        ratio_s = f"{ratio:8.3f}" if ratio is not None else f"{'-':>8}"
        msg = r.message.splitlines()[0][:100] if r.message else ""
        click.echo(f"{r.case:<{w_case}}  {r.impl:<{w_impl}}  {r.status.value:<11}  {ratio_s}  "
                   f"{r.duration_s:6.2f}  {msg}")
    counts = collections.Counter(r.status.value for r in records)
    total = sum(r.duration_s for r in records)
    summary = ", ".join(f"{counts[s.value]} {s.value}" for s in Status if counts[s.value])
    click.echo(f"\n{len(records)} records: {summary}  ({total:.1f}s in cases)")


def junit_rows(records: Sequence[Record]) -> list[dict]:
    """A run's JUnit testcases: failures and errors carry the message and the rank attribution."""
    rows = []
    for r in records:
        detail = "\n".join(f"rank {o.rank}: {o.status} {o.exception_type or ''} {o.message}".strip()
                           for o in r.ranks)
        row = {"classname": r.impl, "name": r.case, "time": r.duration_s, "outcome": "pass"}
        if r.status == Status.MISMATCH or (r.status.value in ("crash", "hang") and not r.known_issue):
            row.update(outcome="failure", message=r.message or r.status.value, type=r.status.value, detail=detail)
        elif r.status == Status.ERROR:
            row.update(outcome="error", message=r.message or "error", type="error", detail=detail)
        elif r.status in (Status.SKIPPED, Status.UNSUPPORTED):
            row.update(outcome="skipped", message=f"{r.status.value}: {r.message}")
        rows.append(row)
    return rows


def write_junit(records: Sequence[Record], path: str) -> None:
    """JUnit XML: one testcase per (case, impl); failures carry the message and rank attribution."""
    write_junit_rows(junit_rows(records), path)


def write_junit_rows(rows: Sequence[dict], path: str, suite_name: str = "syncbn-harness") -> None:
    """JUnit XML from rows of ``classname``, ``name``, ``time``, ``outcome`` (pass, failure, error,
    skipped), ``message``, ``type`` and ``detail``."""
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
