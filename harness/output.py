"""Human and machine output of a run: the summary table and JUnit XML."""

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


def write_junit(records: Sequence[Record], path: str) -> None:
    """JUnit XML: one testcase per (case, impl); failures carry the message and rank attribution."""
    suite = ET.Element("testsuite", name="syncbn-harness", tests=str(len(records)))
    failures = errors = skipped = 0
    for r in records:
        tc = ET.SubElement(suite, "testcase", classname=r.impl, name=r.case, time=f"{r.duration_s:.3f}")
        detail = "\n".join(f"rank {o.rank}: {o.status} {o.exception_type or ''} {o.message}".strip()
                           for o in r.ranks)
        if r.status == Status.MISMATCH or (r.status.value in ("crash", "hang") and not r.known_issue):
            failures += 1
            ET.SubElement(tc, "failure", message=r.message or r.status.value, type=r.status.value).text = detail
        elif r.status == Status.ERROR:
            errors += 1
            ET.SubElement(tc, "error", message=r.message or "error", type="error").text = detail
        elif r.status in (Status.SKIPPED, Status.UNSUPPORTED):
            skipped += 1
            ET.SubElement(tc, "skipped", message=f"{r.status.value}: {r.message}")
    suite.set("failures", str(failures))
    suite.set("errors", str(errors))
    suite.set("skipped", str(skipped))
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)
