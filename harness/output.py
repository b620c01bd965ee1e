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


def status_label(record: Record) -> str:
    """The status as shown to people: ``crash (known)`` for an expected upstream defect."""
    known = record.known_issue or {}
    if known.get("matched"):
        return f"{record.status.value} (known)"
    if known.get("now_passes"):
        return "pass (known issue fixed?)"
    return record.status.value


def print_table(records: Sequence[Record], verbose: bool = False) -> None:
    """A family x implementation summary, then every record that did not pass (all with ``verbose``)."""
    if not records:
        click.echo("no records")
        return
    families = list(dict.fromkeys(r.family for r in records))
    impls = list(dict.fromkeys(r.impl for r in records))
    cells = collections.defaultdict(collections.Counter)
    for r in records:
        cells[(r.impl, r.family)][status_label(r)] += 1
    widths = {f: max(len(f), *(len(_cell(cells[(i, f)])) for i in impls)) for f in families}
    w_impl = max(len("impl"), *(len(i) for i in impls))
    click.echo("  ".join([f"{'impl':<{w_impl}}"] + [f"{f:<{widths[f]}}" for f in families]))
    for i in impls:
        click.echo("  ".join([f"{i:<{w_impl}}"] + [f"{_cell(cells[(i, f)]):<{widths[f]}}" for f in families]))
    shown = [r for r in records if verbose or r.status != Status.PASS or (r.known_issue or {}).get("now_passes")]
    skipped = [r for r in shown if r.status in (Status.SKIPPED, Status.UNSUPPORTED) and not verbose]
    shown = [r for r in shown if r not in skipped]
    if shown:
        w_case = max(len(r.case) for r in shown)
        w_impl = max(len(r.impl) for r in shown)
        click.echo(f"\n{'case':<{w_case}}  {'impl':<{w_impl}}  {'status':<14}  {'err/tol':>8}  {'time':>6}  message")
        for r in shown:
            ratio = worst_ratio(r)
            ratio_s = f"{ratio:8.3f}" if ratio is not None else f"{'-':>8}"
            msg = r.message.splitlines()[0][:110] if r.message else ""
            if (r.known_issue or {}).get("link"):
                msg = f"{msg}  [{r.known_issue['link']}]"
            click.echo(f"{r.case:<{w_case}}  {r.impl:<{w_impl}}  {status_label(r):<14}  {ratio_s}  "
                       f"{r.duration_s:6.2f}  {msg}")
    reasons = collections.Counter((r.impl, r.status.value, r.message.splitlines()[0][:100]) for r in skipped)
    for (impl, status, why), n in reasons.items():
        click.echo(f"{n} {status} for {impl}: {why}")
    counts = collections.Counter(status_label(r) for r in records)
    total = sum(r.duration_s for r in records)
    summary = ", ".join(f"{n} {label}" for label, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    click.echo(f"\n{len(records)} records: {summary}  ({total:.1f}s in cases)")


def _cell(counter: collections.Counter) -> str:
    return ", ".join(f"{n} {label}" for label, n in sorted(counter.items(), key=lambda kv: -kv[1])) or "-"


def junit_rows(records: Sequence[Record]) -> list[dict]:
    """A run's JUnit testcases: failures and errors carry the message and the rank attribution."""
    rows = []
    for r in records:
        detail = "\n".join(f"rank {o.rank}: {o.status} {o.exception_type or ''} {o.message}".strip()
                           for o in r.ranks)
        row = {"classname": r.impl, "name": r.case, "time": r.duration_s, "outcome": "pass"}
        if (r.known_issue or {}).get("matched"):
            row.update(outcome="skipped", message=f"known issue {r.known_issue['link']}: {r.status.value}: "
                                                   f"{r.message}")
        elif r.status in (Status.MISMATCH, Status.CRASH, Status.HANG):
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
