"""What ``torch.compile`` did in a record, as people and ``diff`` read it.

A compiled case's record carries ``Record.compile`` (harness.engine.compiled):
the options (``backend``, ``fullgraph``, ``dynamic``) and per rank the graphs
compiled, the ops in them, the graph breaks (reason, where, count), the frames
dynamo gave up on and ran eagerly, the recompiles (the guard that failed) and
how the compiled pass compared with the eager one.

- :func:`summary`: one line per record (``rank 0: 7 graphs, 4 breaks, ...``);
- :func:`signature`: what a build change must keep to count as the same
  compilation: per rank the graph count and the set of break and eager-frame
  reasons (counts of each break and where it is are left out: line numbers
  move with any edit of torch);
- :func:`change`: how two records' signatures differ (``rank 0: graphs 7 -> 6;
  new break: ...``), or None; ``diff`` reports it as its own kind and ``gate
  --fail-on-graph-break-change`` fails on it;
- :func:`columns`, :func:`markdown_table`, :func:`html_table`: the report's
  columns and its section of compiled cases.
"""

from __future__ import annotations

import html
import re
from typing import Optional

from harness.results.records import Record


def options(record: Record) -> str:
    """``aot_eager fullgraph dynamic`` (the backend and the options that are on)."""
    c = record.compile or {}
    if not c:
        return ""
    return " ".join([str(c.get("backend"))] + (["fullgraph"] if c.get("fullgraph") else [])
                    + (["dynamic"] if c.get("dynamic") else []))


def counts(stats: dict) -> tuple[int, int, int]:
    """(graph breaks, frames run eagerly, recompiles) of one rank, each event counted as often as it happened."""
    return tuple(sum(b.get("count", 1) for b in stats.get(key, []))
                 for key in ("graph_breaks", "skipped_frames", "recompiles"))


def versus_eager(stats: dict) -> str:
    """``bitwise``, ``max 1.2e-07`` (the largest difference from the eager run) or ``-`` (not compared)."""
    versus = stats.get("vs_eager")
    if not versus:
        return "-"
    return "bitwise" if versus.get("bitwise") else f"max {versus.get('max_abs_diff', 0):.3g}"


def rank_line(rank: str, stats: dict) -> str:
    """``rank 0: 7 graphs (70 ops), 4 breaks, 0 frames eager, 5 recompiles; bitwise eager``."""
    breaks, eager, recompiles = counts(stats)
    text = (f"rank {rank}: {stats.get('graphs', 0)} graphs ({stats.get('ops', 0)} ops), {breaks} breaks, "
            f"{eager} frames run eagerly, {recompiles} recompiles")
    versus = stats.get("vs_eager")
    if versus:
        text += ("; bitwise eager" if versus.get("bitwise") else
                 f"; differs from eager in {versus.get('differing')} of {versus.get('compared')} tensors "
                 f"(max {versus.get('max_abs_diff', 0):.3g})")
    return text


def summary(record: Record) -> list[str]:
    """Per rank, what dynamo did (with the reasons of the breaks and eager frames, each once)."""
    out = []
    for rank, stats in sorted(record.compile_ranks().items(), key=lambda kv: int(kv[0])):
        out.append(rank_line(rank, stats))
        out += [f"  break x{b.get('count', 1)}: {b['reason']}" + (f" at {b['where']}" if b.get("where") else "")
                for b in stats.get("graph_breaks", [])]
        out += [f"  eager frame x{b.get('count', 1)}: {b['reason']}" for b in stats.get("skipped_frames", [])]
    return out


_INSTALLED = re.compile(r"/[^\s()'\"]*/(?:site|dist)-packages/")


def portable(reason: str) -> str:
    """A reason with the install location cut (``/x/.venv/lib/python3.11/site-packages/torch/_compile`` ->
    ``torch/_compile``): the same break in two environments reads the same."""
    return _INSTALLED.sub("", reason)


def signature(record: Record) -> Optional[dict]:
    """Per rank: (graphs, break reasons, eager-frame reasons); None for a record without compile metrics.
    Reasons are :func:`portable`, so two builds installed in different places compare equal."""
    ranks = record.compile_ranks()
    if not ranks:
        return None
    return {rank: (s.get("graphs", 0), frozenset(portable(b["reason"]) for b in s.get("graph_breaks", [])),
                   frozenset(portable(b["reason"]) for b in s.get("skipped_frames", [])))
            for rank, s in ranks.items()}


def change(before: Record, after: Record) -> Optional[str]:
    """How the compilation changed between two records of one case (first rank that differs), or None."""
    a, b = signature(before), signature(after)
    if a is None or b is None:
        return None
    for rank in sorted(set(a) & set(b), key=int):
        (ga, ba, ea), (gb, bb, eb) = a[rank], b[rank]
        parts = []
        if ga != gb:
            parts.append(f"graphs {ga} -> {gb}")
        parts += [f"new break: {r}" for r in sorted(bb - ba)] + [f"break gone: {r}" for r in sorted(ba - bb)]
        parts += [f"new eager frame: {r}" for r in sorted(eb - ea)]
        parts += [f"eager frame gone: {r}" for r in sorted(ea - eb)]
        if parts:
            return f"rank {rank}: " + "; ".join(parts)
    return None


def columns(record: Record) -> dict:
    """The report's columns of a record (empty strings for one that was not compiled): rank 0's figures."""
    if not record.compile:
        return {k: "" for k in ("compile", "graphs", "breaks", "eager_frames", "recompiles", "vs_eager",
                                "compile_details")}
    ranks = record.compile_ranks()
    stats = ranks.get("0") or next(iter(ranks.values()), {})
    breaks, eager, recompiles = counts(stats)
    return {"compile": options(record), "graphs": stats.get("graphs", 0), "breaks": breaks, "eager_frames": eager,
            "recompiles": recompiles, "vs_eager": versus_eager(stats), "compile_details": "\n".join(summary(record))}


HEAD = ("impl", "build", "case", "compile", "status", "graphs", "breaks", "eager_frames", "recompiles", "vs_eager")


def _compiled(df):
    if "compile" not in df.columns:
        return df.iloc[0:0]
    return df[df["compile"] != ""].sort_values(["impl", "build", "case"])


def markdown_table(df) -> list[str]:
    """The report's Markdown section of compiled cases (rank 0's figures), or nothing without any."""
    sub = _compiled(df)
    if sub.empty:
        return []
    lines = ["", f"## torch.compile ({len(sub)} compiled records; rank 0)", "",
             "| " + " | ".join(h.replace("_", " ") for h in HEAD) + " |", "|---" * len(HEAD) + "|"]
    for _, row in sub.iterrows():
        status = row["status"] + (" (known)" if row["known_issue"] else "")
        cells = [str(row[h]) if h != "status" else status for h in HEAD]
        lines.append("| " + " | ".join(f"`{c}`" if h in ("build", "case") else c for h, c in zip(HEAD, cells))
                     + " |")
    return lines


def html_table(df) -> str:
    """The report's HTML section of compiled cases, the reasons of breaks and eager frames folded per row."""
    sub = _compiled(df)
    if sub.empty:
        return ""
    out = [f"<section id='compile'><h2>torch.compile ({len(sub)} compiled records; rank 0)</h2>",
           "<table class='compile'><thead><tr>" + "".join(f"<th>{h.replace('_', ' ')}</th>" for h in HEAD)
           + "</tr></thead><tbody>"]
    for _, row in sub.iterrows():
        status = row["status"] + (" (known)" if row["known_issue"] else "")
        cells = [html.escape(str(row[h]) if h != "status" else status) for h in HEAD]
        cells[-1] += (f"<details><summary>per rank</summary><pre>{html.escape(row['compile_details'])}</pre>"
                      "</details>" if row["compile_details"] else "")
        out.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    out.append("</tbody></table></section>")
    return "\n".join(out)
