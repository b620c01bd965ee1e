"""What a run prints for people, in at most :data:`WIDTH` columns: the summary, what needs a look, the totals.

In order:

1. the summary: families as rows, implementations as columns, each cell the
   counts per status in letters (:data:`LETTERS`, lowercase for a known issue,
   ``27P 3c``), then the legend; with more implementations than fit, the table
   is printed in blocks of whole columns, the family column repeated;
2. unexpected failures, first, each as three lines (the case; its status,
   implementation and err/tol; the first line of its message), cut at the width;
3. known issues, one per issue: how many records, their statuses,
   implementations and families, then its link; ``--verbose`` lists every
   record one by one instead (the report and the records hold every message);
4. one line per implementation and reason for what could not run at all,
   wrapped;
5. the totals, wrapped.

Numbers are compact (``1.77e+11``); a cut line ends in `` ...``.
"""

from __future__ import annotations

import collections
import math
import textwrap
from typing import Callable, Optional, Sequence

from harness.judge.status import NOT_RUN, Status
from harness.results.records import Record

Echo = Callable[[str], None]
WIDTH = 100
LETTERS = {Status.PASS: "P", Status.MISMATCH: "M", Status.ERROR: "E", Status.CRASH: "C", Status.HANG: "H",
           Status.UNSUPPORTED: "U", Status.SKIPPED: "S"}
LEGEND = ("P pass, M mismatch, E error, C crash, H hang, U unsupported, S skipped; "
          "lowercase: a known issue")


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


def cut(line: str, width: int = WIDTH) -> str:
    """``line`` in at most ``width`` columns, ending in `` ...`` where it was cut."""
    return line if len(line) <= width else line[:width - 4].rstrip() + " ..."


def _letter(r: Record) -> str:
    letter = LETTERS[r.status]
    return letter.lower() if r.known else letter


def _cell(records: Sequence[Record]) -> str:
    counts = collections.Counter(_letter(r) for r in records)
    order = "PMmEeCcHhUS"
    return " ".join(f"{counts[k]}{k}" for k in sorted(counts, key=order.index)) or "-"


def summary_blocks(records: Sequence[Record], width: int = WIDTH) -> list[list[list[str]]]:
    """The family x implementation summary as tables of rows (header first), split by implementation so that
    each fits ``width`` columns."""
    families = list(dict.fromkeys(r.family for r in records))
    impls = list(dict.fromkeys(r.impl for r in records))
    by_cell: dict = collections.defaultdict(list)
    for r in records:
        by_cell[(r.family, r.impl)].append(r)
    cells = {key: _cell(rs) for key, rs in by_cell.items()}
    first = max(len("family"), *(len(f) for f in families))
    blocks, current, used = [], [], first
    for impl in impls:
        w = max(len(impl), *(len(cells.get((f, impl), "-")) for f in families))
        if current and used + 2 + w > width:
            blocks.append(current)
            current, used = [], first
        current.append(impl)
        used += 2 + w
    blocks.append(current)
    return [[["family", *block]] + [[f, *(cells.get((f, i), "-") for i in block)] for f in families]
            for block in blocks]


def columns(rows: list[list[str]], right: Sequence[int] = ()) -> list[str]:
    """Rows of cells as lines, each column as wide as its widest cell (``right``: right-aligned columns)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = []
    for row in rows:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        out.append("  ".join(cells).rstrip())
    return out


def failure_lines(r: Record) -> list[str]:
    """One record: its case; its status, implementation and worst err/tol; the first line of its message."""
    msg = r.message.splitlines()[0] if r.message else ""
    lines = [cut(f"  {r.case}"), cut(f"      {r.label}  {r.impl}  err/tol {format_ratio(r.worst_ratio)}")]
    return lines + ([cut(f"      {msg}")] if msg else [])


def known_issue_lines(records: Sequence[Record]) -> list[str]:
    """One entry per known issue (records grouped by its link): count, statuses, implementations, families;
    then the link on its own line."""
    groups: dict = collections.defaultdict(list)
    for r in records:
        groups[r.known_issue.link if r.known_issue else ""].append(r)
    out = []
    for link, rs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        statuses = "/".join(dict.fromkeys(r.status.value for r in rs))
        impls = ", ".join(dict.fromkeys(r.impl for r in rs))
        families = ", ".join(dict.fromkeys(r.family for r in rs))
        out.append(cut(f"  {len(rs):>4} {statuses}  {impls}: {families}"))
        out.append(cut(f"         {link}"))
    return out


def not_run_lines(records: Sequence[Record], width: int = WIDTH) -> list[str]:
    """One entry per (impl, status, reason) of records that did not run, the whole reason wrapped to ``width``."""
    reasons = collections.Counter((r.impl, r.status.value, r.message) for r in records if r.status in NOT_RUN)
    out = []
    for (impl, status, why), n in reasons.items():
        out += textwrap.wrap(f"{impl}: {n} {status}: {why}", width, subsequent_indent="    ",
                             break_on_hyphens=False)
    return out


def totals_line(records: Sequence[Record]) -> str:
    """``52 records: 52 pass  (0.9s in cases)``, the counts by label, most first (one line, however long)."""
    counts = collections.Counter(r.label for r in records)
    summary = ", ".join(f"{n} {label}" for label, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"{len(records)} records: {summary}  ({sum(r.duration_s for r in records):.1f}s in cases)"


def totals_lines(records: Sequence[Record], width: int = WIDTH) -> list[str]:
    """:func:`totals_line` wrapped to ``width`` columns."""
    return textwrap.wrap(totals_line(records), width, subsequent_indent="    ", break_on_hyphens=False)


def print_table(records: Sequence[Record], verbose: bool = False, echo: Optional[Echo] = None) -> None:
    """The summary, unexpected failures, known issues (every record with ``verbose``), what did not run, totals."""
    if echo is None:
        import click

        echo = click.echo
    if not records:
        echo("no records")
        return
    for i, block in enumerate(summary_blocks(records)):
        if i:
            echo("")
        for line in columns(block):
            echo(line)
    echo(cut(LEGEND))
    ran = [r for r in records if r.status not in NOT_RUN]
    if verbose:
        echo("")
        echo("every record:")
        for r in ran:
            for line in failure_lines(r):
                echo(line)
    else:
        unexpected = [r for r in ran if r.label != "pass" and not r.known]
        known = [r for r in ran if r.known]
        if unexpected:
            echo("")
            echo(f"unexpected ({len(unexpected)}):")
            for r in unexpected:
                for line in failure_lines(r):
                    echo(line)
        if known:
            echo("")
            echo(f"known issues ({len(known)} records, expected; -v lists them one by one):")
            for line in known_issue_lines(known):
                echo(line)
    lines = not_run_lines(records)
    if lines:
        echo("")
        for line in lines:
            echo(line)
    echo("")
    for line in totals_lines(records):
        echo(line)
