"""What a run prints for people: a family x implementation summary, the records that need a look, the totals.

- The summary counts each (impl, family) cell per status; known issues say
  ``(known)``.
- Then one line per record that did not pass (every record with ``-v``):
  case, impl, status, the worst error/tolerance ratio, seconds, message.
- An implementation that could not run here (not installed, say) is one line
  with its whole reason, not one line per record.
- Numbers are compact (``1.77e+11``); columns are as wide as their content.
"""

from __future__ import annotations

import collections
import math
from typing import Callable, Optional, Sequence

from harness.results.records import NOT_RUN, Record, Status

Echo = Callable[[str], None]
MESSAGE_WIDTH = 110


def format_ratio(x: Optional[float]) -> str:
    """err/tol as people read it: ``0.0312``, ``938``, ``1.77e+11``, ``inf``; ``-`` when nothing was compared."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.3g}"


def format_size(n: float) -> str:
    """Bytes as people read them: ``512 B``, ``7.4 KB``, ``352.4 MB``, ``5.5 GB``."""
    for unit in ("B", "KB", "MB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def _cell(counter: collections.Counter) -> str:
    return ", ".join(f"{n} {label}" for label, n in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))) or "-"


def summary_matrix(records: Sequence[Record]) -> list[list[str]]:
    """Rows of the family x implementation summary, the header first."""
    families = list(dict.fromkeys(r.family for r in records))
    impls = list(dict.fromkeys(r.impl for r in records))
    cells: dict = collections.defaultdict(collections.Counter)
    for r in records:
        cells[(r.impl, r.family)][r.label] += 1
    return [["impl", *families]] + [[i, *(_cell(cells[(i, f)]) for f in families)] for i in impls]


def columns(rows: list[list[str]], right: Sequence[int] = ()) -> list[str]:
    """Rows of cells as lines, each column as wide as its widest cell (``right``: right-aligned columns)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = []
    for row in rows:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        out.append("  ".join(cells).rstrip())
    return out


def record_line_cells(r: Record) -> list[str]:
    msg = r.message.splitlines()[0] if r.message else ""
    if len(msg) > MESSAGE_WIDTH:
        msg = msg[:MESSAGE_WIDTH - 3].rsplit(" ", 1)[0] + " ..."
    if r.known_issue and r.known_issue.link and (r.known or r.known_issue.now_passes):
        msg = f"{msg}  [{r.known_issue.link}]".strip()
    return [r.case, r.impl, r.label, format_ratio(r.worst_ratio), f"{r.duration_s:.2f}", msg]


def not_run_lines(records: Sequence[Record]) -> list[str]:
    """One line per (impl, status, reason) of records that did not run, with the whole reason."""
    reasons = collections.Counter((r.impl, r.status.value, r.message) for r in records if r.status in NOT_RUN)
    return [f"{impl}: {n} {status}: {why}" for (impl, status, why), n in reasons.items()]


def totals_line(records: Sequence[Record]) -> str:
    counts = collections.Counter(r.label for r in records)
    summary = ", ".join(f"{n} {label}" for label, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"{len(records)} records: {summary}  ({sum(r.duration_s for r in records):.1f}s in cases)"


def print_table(records: Sequence[Record], verbose: bool = False, echo: Optional[Echo] = None) -> None:
    """The summary, the records that need a look (all with ``verbose``), the not-run reasons, the totals."""
    if echo is None:
        import click

        echo = click.echo
    if not records:
        echo("no records")
        return
    for line in columns(summary_matrix(records)):
        echo(line)
    shown = [r for r in records
             if verbose or (r.status not in NOT_RUN and (r.status != Status.PASS or r.label != "pass"))]
    if shown:
        echo("")
        rows = [["case", "impl", "status", "err/tol", "time", "message"]] + [record_line_cells(r) for r in shown]
        for line in columns(rows, right=(3, 4)):
            echo(line)
    lines = not_run_lines(records)
    if lines:
        echo("")
        for line in lines:
            echo(line)
    echo("")
    echo(totals_line(records))
