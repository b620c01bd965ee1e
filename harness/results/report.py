"""Reports over the store: a self-contained HTML page, a Markdown summary and CSV.

Everything is computed with pandas from the latest record of each (build,
impl, case) in the store (a re-run supersedes earlier records):

- ``records`` frame: one row per record; ``metrics`` frame: one row per
  compared tensor (rank, step, tensor, max_abs_err, tol, ratio).
- Per implementation, a build x case-family matrix (builds by key, but an
  overlay bisection's in their commits' order on the branch, approximate ones
  marked ``~``: :mod:`harness.results.timeline`): each cell holds the
  counts per status and is colored by its worst status (:data:`SEVERITY`);
  failures the known-issues file expects count as ``known`` (their own
  color), so a cell is red only for what is new.
- The failing cases with their messages, the ranks to blame, what each rank
  said (its collectives, :mod:`harness.results.fingerprint`), the first
  collective the ranks disagreed on, and what a debug re-run said.
- The compiled cases (``torch.compile``): per record the options, graphs,
  graph breaks, frames run eagerly, recompiles and the comparison with the
  eager run (:mod:`harness.results.compile_stats`), the reasons folded under.
- Error against tolerance, per tensor, log-log (matplotlib, Agg), one plot per
  implementation, one color per build; points above the diagonal failed.

The HTML has no external script, style, font or image: CSS is inline and
plots are PNG ``data:`` URIs, so the file can be attached to an issue or
archived by CI as one artifact. The Markdown fits a CI job summary.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from harness import __version__
from harness.errors import HarnessError, UsageError
from harness.results import compile_stats, fingerprint, timeline
from harness.results.records import FAILURES, WORST_FIRST, RankStatus, Record
from harness.results.store import record_key

# The statuses that fail a run, worst first (from the Status enum).
FAILING = tuple(s.value for s in WORST_FIRST if s in FAILURES)
# Worst first: a cell takes the color of its worst status; "known" is a failure the known-issues file expects.
SEVERITY = FAILING + ("known",) + tuple(s.value for s in WORST_FIRST if s not in FAILURES)
COLORS = {
    "crash": "#8b0000", "hang": "#6a1b9a", "error": "#d32f2f", "mismatch": "#f57c00", "known": "#5c7080",
    "pass": "#2e7d32", "unsupported": "#9e9e9e", "skipped": "#cfd8dc",
}
LEGEND = {"known": "known issue (expected failure)"}
assert set(COLORS) == set(SEVERITY), "every status needs a color"


class ReportError(HarnessError):
    """The output directory cannot be written (exit 3)."""


class EmptyStore(UsageError):
    """The store holds no records: nothing to report (exit 2, like any store or build that is not there)."""


@dataclass
class ReportFiles:
    """Paths of what :func:`write_report` wrote."""

    html: Path
    markdown: Path
    csv: list[Path]  # per build, with --csv


def attribution(record: Record) -> str:
    """Which ranks failed and how: ``rank 1: crash SIGSEGV; rank 0: peer-failed``."""
    parts = []
    for o in record.ranks:
        if o.status is RankStatus.PASS:
            continue
        if o.status is RankStatus.PEER_FAILED:
            parts.append(f"rank {o.rank}: {o.status.value}")
            continue
        how = o.signal or o.exception_type or (f"exit {o.exit_code}" if o.exit_code not in (None, 0) else "")
        parts.append(f"rank {o.rank}: {o.status.value}" + (f" {how}" if how else ""))
    return "; ".join(parts)


def records_frame(records: Sequence[Record]):
    """One row per record: build, impl, case, family, status, worst err/tol, attribution, params..."""
    import pandas as pd

    rows = []
    for r in records:
        row = {"build": record_key(r), "torch_version": r.torch_version, "torch_git_version": r.torch_git_version,
               "device": r.device, "backend": r.backend, "impl": r.impl, "impl_version": r.impl_version,
               "mode": r.mode, "case": r.case, "family": r.family, "status": r.status.value,
               "known_issue": r.known,
               "known_link": r.known_issue.link if r.known_issue else "",
               "worst_ratio": r.worst_ratio, "message": r.message, "ranks": attribution(r),
               "collectives": "\n".join(fingerprint.per_rank(r)) if r.status.value in FAILING else "",
               "desync": (r.desync or {}).get("message", ""),
               "diagnosis": (r.diagnosis or {}).get("summary") or "",
               "world_size": r.world_size, "duration_s": r.duration_s, "started_at": r.started_at, "host": r.host,
               **compile_stats.columns(r)}
        for k, v in sorted(r.params.items()):
            row[f"param.{k}"] = json.dumps(v) if isinstance(v, (list, dict)) else v
        rows.append(row)
    return pd.DataFrame(rows)


def metrics_frame(records: Sequence[Record]):
    """One row per compared tensor: build, impl, case, metric name, tensor, max_abs_err, tol, ratio, ok."""
    import pandas as pd

    rows = []
    for r in records:
        for name, m in r.metrics.items():
            rows.append({"build": record_key(r), "impl": r.impl, "case": r.case, "status": r.status.value,
                         "metric": name, "tensor": name.rsplit(".", 1)[-1], "max_abs_err": m.max_abs_err,
                         "max_rel_err": m.max_rel_err, "tol": m.tol, "ratio": m.ratio, "ok": m.ok,
                         "problem": m.problem})
    frame = pd.DataFrame(rows, columns=["build", "impl", "case", "status", "metric", "tensor", "max_abs_err",
                                        "max_rel_err", "tol", "ratio", "ok", "problem"])
    # Numbers even when no record compared anything (a store of skipped records): an empty column is untyped.
    return frame.astype({"max_abs_err": float, "max_rel_err": float, "tol": float, "ratio": float})


def _kind(label: str) -> str:
    """``crash (known)`` -> ``known``; a plain status stays itself."""
    return "known" if label.endswith("(known)") else label


def worst_status(labels) -> str:
    """The most severe of some cell labels (:data:`SEVERITY`); expected failures count as ``known``."""
    kinds = {_kind(label) for label in labels}
    return next((s for s in SEVERITY if s in kinds), "skipped")


def status_matrix(cells, impl: str) -> dict:
    """``{build: {family: {label: count}}}`` for one implementation, from :attr:`Page.cells`.

    A label is a status, or ``"<status> (known)"`` for the failures the
    known-issues file expects (counted there and not under the plain status).
    """
    out: dict = {}
    for row in cells[cells["impl"] == impl].itertuples(index=False):
        label = f"{row.status} (known)" if row.known_issue else row.status
        cell = out.setdefault(row.build, {}).setdefault(row.family, {})
        cell[label] = cell.get(label, 0) + int(row.n)
    return out


def _cell_text(counts: dict) -> str:
    ordered = sorted(counts.items(), key=lambda kv: (SEVERITY.index(_kind(kv[0])), kv[0]))
    return ", ".join(f"{n} {label}" for label, n in ordered)


def plottable(metrics):
    """The tensors a log-log plot can show: finite error, finite positive tolerance."""
    import numpy as np

    return metrics[np.isfinite(metrics["tol"]) & (metrics["tol"] > 0) & np.isfinite(metrics["max_abs_err"])]


def scatter_png(metrics, impl: str) -> Optional[bytes]:
    """PNG of max_abs_err against tol per tensor (log-log) for one implementation, or None without data."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    sub = plottable(metrics[metrics["impl"] == impl])
    if sub.empty:
        return None
    positive = sub["max_abs_err"] > 0
    floor = sub.loc[positive, "max_abs_err"].min() / 10 if positive.any() else sub["tol"].min() * 1e-6
    fig, ax = plt.subplots(figsize=(7, 5), dpi=96)
    for i, (build, g) in enumerate(sorted(sub.groupby("build"), key=lambda kv: kv[0])):
        err = g["max_abs_err"].where(g["max_abs_err"] > 0, floor)
        ax.scatter(g["tol"], err, s=9, alpha=0.6, label=f"{build} ({len(g)})", color=f"C{i}", linewidths=0)
        bad = ~g["ok"]
        if bad.any():
            ax.scatter(g.loc[bad, "tol"], g.loc[bad, "max_abs_err"], s=40, facecolors="none", edgecolors="red",
                       linewidths=1.0)
    lo = min(sub["tol"].min(), floor)
    hi = max(sub["tol"].max(), sub["max_abs_err"].max())
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=1, label="err = tol")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tolerance at the worst element (largest err/tol)")
    ax.set_ylabel("max abs error (exact zeros drawn at the bottom)")
    ax.set_title(f"{impl}: error against tolerance per tensor")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


MAX_FAILING = 200  # rows of the failing table on the page (the rest counted, and how to list them)
MAX_COMPILED = 200  # rows of the compiled cases' table
PLOT_SAMPLE = 400  # records per implementation whose tensors are plotted (the worst ones first)


@dataclass
class Page:
    """What the page and the summary show, gathered from the index in bounded memory.

    ``cells``: one row per (build, impl, family, status, known_issue) with its count ``n``; ``builds``: each
    build's key and torch_git_version; ``failing``/``compiled``: records frames of the rows shown, with the
    totals they were cut from; ``plots``: per implementation the metrics frame of a sample and its size."""

    store_dir: str
    total: int
    cells: object
    builds: object
    failing: object
    failing_total: int
    failing_known: int
    compiled: object
    compiled_total: int
    plots: dict  # impl -> (metrics frame of the sample, records sampled, records with metrics)
    modes: dict  # impl -> its modes, comma-separated


def _frame(index, where: str, params: tuple, order: str, limit: int):
    """A records frame of the latest records matching ``where``, in ``order``, at most ``limit``."""
    rows = index.query(f"SELECT file, offset, length FROM latest WHERE {where} ORDER BY {order} LIMIT ?",
                       (*params, limit))
    return records_frame(list(index.load(rows)))


def gather(store_dir) -> Page:
    """The page's data: counts by SQL over the store's index, and only the records shown read back."""
    import pandas as pd

    from harness.results.index import refreshed

    with refreshed(store_dir) as index:
        ((total,),) = index.query("SELECT count(*) FROM latest")
        if not total:
            raise EmptyStore(f"the store {store_dir} holds no records: run `syncbn-harness run --store "
                             f"{store_dir}` first, or point --store at another directory")
        cells = pd.DataFrame(index.query("SELECT build, impl, family, status, known, count(*) FROM latest "
                                         "GROUP BY build, impl, family, status, known"),
                             columns=["build", "impl", "family", "status", "known_issue", "n"])
        cells["known_issue"] = cells["known_issue"].astype(bool)
        builds = pd.DataFrame(index.query("SELECT build, max(torch_git_version) FROM latest GROUP BY build"),
                              columns=["build", "torch_git_version"])
        failing_where = f"status IN ({', '.join('?' * len(FAILING))})"
        ((failing_total, failing_known),) = index.query(
            f"SELECT count(*), coalesce(sum(known), 0) FROM latest WHERE {failing_where}", FAILING)
        failing = _frame(index, failing_where, FAILING, "known, impl, build, case_id", MAX_FAILING)
        ((compiled_total,),) = index.query("SELECT count(*) FROM latest WHERE compiled = 1")
        compiled = _frame(index, "compiled = 1", (), "impl, build, case_id", MAX_COMPILED)
        plots = {}
        for (impl,) in index.query("SELECT DISTINCT impl FROM latest ORDER BY impl"):
            rows = index.query("SELECT file, offset, length FROM latest WHERE impl = ? AND has_metrics = 1 "
                               "ORDER BY coalesce(worst_ratio, 0) > 1 DESC, (id * 2654435761) % 1000003 LIMIT ?",
                               (impl, PLOT_SAMPLE))
            ((with_metrics,),) = index.query("SELECT count(*) FROM latest WHERE impl = ? AND has_metrics = 1",
                                             (impl,))
            plots[impl] = (metrics_frame(list(index.load(rows))), len(rows), with_metrics)
        modes = dict(index.query("SELECT impl, group_concat(DISTINCT mode) FROM latest GROUP BY impl"))
    return Page(str(store_dir), total, cells, builds, failing, failing_total, failing_known, compiled,
                compiled_total, plots, modes)


def write_report(store_dir, out_dir="reports", csv: bool = False) -> ReportFiles:
    """Write ``index.html`` and ``summary.md`` into ``out_dir`` (and with ``csv`` every build's records and
    per-tensor metrics as ``csv/<build>.records.csv`` and ``csv/<build>.metrics.csv``)."""
    page = gather(store_dir)
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        files = ReportFiles(out / "index.html", out / "summary.md", [])
        # A record's text may hold what UTF-8 cannot (a lone surrogate from a plugin): written as an escape.
        files.markdown.write_text(markdown_summary(page), encoding="utf-8", errors="backslashreplace")
        files.html.write_text(html_page(page), encoding="utf-8", errors="backslashreplace")
        if csv:
            files.csv = write_csv(store_dir, out / "csv")
    except OSError as exc:
        raise ReportError(f"cannot write the report into {out}: {exc.strerror}; choose another with --out DIR") \
            from None
    return files


def write_csv(store_dir, out: Path) -> list[Path]:
    """Per build, its latest records (one row each) and their compared tensors: one build in memory at a time."""
    from harness.results.index import refreshed

    out.mkdir(parents=True, exist_ok=True)
    written = []
    with refreshed(store_dir) as index:
        for (build,) in index.query("SELECT DISTINCT build FROM latest ORDER BY build"):
            rows = index.query("SELECT file, offset, length FROM latest WHERE build = ? ORDER BY id", (build,))
            records = list(index.load(rows))
            for kind, frame in (("records", records_frame(records)), ("metrics", metrics_frame(records))):
                path = out / f"{build}.{kind}.csv"
                frame.to_csv(path, index=False, errors="backslashreplace")
                written.append(path)
    return written


# --- Markdown -------------------------------------------------------------------------------------------------

def _more(shown: int, total: int, what: str, store_dir) -> str:
    """What a capped table leaves out, and how to list it all."""
    if total <= shown:
        return ""
    return (f"{total - shown} more {what} not shown: `syncbn-harness report --store {store_dir} --csv` writes "
            "every record per build, or read the store's .jsonl files with jq")


def markdown_summary(page: Page, max_failures: int = 30) -> str:
    """A summary fit for a CI job summary or an issue: per impl the matrix, then the failing cases."""
    cells = page.cells
    lines = ["# SyncBN harness report", "",
             f"{page.total} records over {len(page.builds)} build(s) from `{page.store_dir}` "
             f"(syncbn-harness {__version__}).", ""]
    totals = cells.groupby("status")["n"].sum()
    lines.append("Totals: " + ", ".join(f"{int(totals[s])} {s}" for s in SEVERITY if s in totals) + ".")
    rows = timeline.rows(page.builds, page.store_dir)
    for impl in sorted(cells["impl"].unique()):
        matrix = status_matrix(cells, impl)
        families = sorted({f for fams in matrix.values() for f in fams})
        lines += ["", f"## {impl}", "", "| build | " + " | ".join(families) + " |",
                  "|---|" + "---|" * len(families)]
        for build, shown in rows:
            if build not in matrix:
                continue
            lines.append(f"| `{shown}` | " + " | ".join(_md_cell(matrix[build].get(f, {})) for f in families) + " |")
    lines += compile_stats.markdown_table(page.compiled)
    failing = page.failing
    lines += ["", f"## Failing cases ({page.failing_total}, {page.failing_known} of them known issues)", ""]
    if failing.empty:
        lines.append("None.")
    else:
        lines += ["| impl | build | case | status | ranks | message |", "|---|---|---|---|---|---|"]
        for _, row in failing.head(max_failures).iterrows():
            known = ""
            if row["known_issue"]:
                known = f" ([known]({row['known_link']}))" if row["known_link"] else " (known)"
            status = f"{row['status']}{known}" if row["known_issue"] else f"**{row['status']}**"
            lines.append(f"| {row['impl']} | `{row['build']}` | `{row['case']}` | {status} | "
                         f"{_md(row['ranks'])} | {_md(_first_line(row['message'], 160))} |")
        more = _more(min(len(failing), max_failures), page.failing_total, "failing records", page.store_dir)
        if more:
            lines.append(f"\n{more}.")
    return "\n".join(lines) + "\n"


def _md_cell(counts: dict) -> str:
    if not counts:
        return ""
    worst = worst_status(counts)
    text = _cell_text(counts)
    return f"**{text}**" if worst in FAILING else text


def _md(text) -> str:
    return str(text or "").replace("|", "\\|").replace("\n", " ")


def _first_line(text, limit: int) -> str:
    text = str(text or "")
    return text.splitlines()[0][:limit] if text else ""


# --- HTML -----------------------------------------------------------------------------------------------------

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.25em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.85em; }
th, td { border: 1px solid #bbb; padding: 0.3em 0.5em; text-align: left; vertical-align: top; }
th { background: #eee; }
td.cell { color: #fff; font-weight: 600; text-align: center; min-width: 7em; }
td.cell.status-skipped, td.cell.status-unsupported { color: #222; }
td.cell a { color: inherit; }
td.empty { background: #fafafa; }
td.msg { max-width: 50em; font-family: ui-monospace, monospace; font-size: 0.95em; white-space: pre-wrap; }
.legend span { display: inline-block; padding: 0.1em 0.6em; margin-right: 0.3em; color: #fff; }
.legend span.status-skipped, .legend span.status-unsupported { color: #222; }
img.plot { max-width: 100%; border: 1px solid #ddd; }
""" + "\n".join(f".status-{s} {{ background: {c}; }}" for s, c in COLORS.items())


def _e(x) -> str:
    return html.escape(str(x if x is not None else ""))


def html_page(page: Page) -> str:
    """The whole self-contained HTML page (inline CSS, plots as data: URIs), small whatever the store's size:
    tables capped (with what they leave out and how to list it), plots over a sample."""
    parts = ["<!DOCTYPE html>", "<html lang='en'><head><meta charset='utf-8'>",
             "<title>SyncBN harness report</title>", f"<style>{CSS}</style></head><body>",
             "<h1>SyncBN harness report</h1>",
             f"<p>{page.total} records over {len(page.builds)} build(s) from <code>{_e(page.store_dir)}</code>, "
             f"syncbn-harness {_e(__version__)}. Each cell counts the (case) results of one build and case family; "
             "its color is its worst status.</p>",
             "<p class='legend'>" + "".join(f"<span class='status-{s}'>{LEGEND.get(s, s)}</span>" for s in SEVERITY)
             + "</p>"]
    rows = timeline.rows(page.builds, page.store_dir)
    if any(shown.endswith("~") for _, shown in rows):
        parts.append("<p>Builds marked ~ are approximate overlays: a commit's Python laid over a binary built "
                     "from another commit, with compiled files that differ left out (the records' "
                     "torch_git_version says how many).</p>")
    for impl in sorted(page.cells["impl"].unique()):
        parts.append(_impl_section(page, impl, rows))
    parts.append(compile_stats.html_table(page.compiled))
    more = _more(len(page.compiled), page.compiled_total, "compiled records", page.store_dir)
    if more:
        parts.append(f"<p class='more'>{_e(more)}.</p>")
    parts.append(_failing_table(page))
    parts.append("</body></html>")
    return "\n".join(parts)


def _impl_section(page: Page, impl: str, rows: list[tuple[str, str]]) -> str:
    matrix = status_matrix(page.cells, impl)
    families = sorted({f for cells in matrix.values() for f in cells})
    n = int(page.cells.loc[page.cells["impl"] == impl, "n"].sum())
    modes = ", ".join(sorted(m for m in str(page.modes.get(impl) or "").split(",") if m)) or "-"
    out = [f"<section class='impl' id='impl-{_e(impl)}'><h2>{_e(impl)}</h2>",
           f"<p>mode: {_e(modes)}; {n} records.</p>",
           f"<table class='matrix' data-impl='{_e(impl)}'><thead><tr><th>build</th>"
           + "".join(f"<th>{_e(f)}</th>" for f in families) + "</tr></thead><tbody>"]
    for build, shown in rows:
        if build not in matrix:
            continue
        cells = []
        for fam in families:
            counts = matrix[build].get(fam)
            if not counts:
                cells.append("<td class='empty'></td>")
                continue
            worst = worst_status(counts)
            cells.append(f"<td class='cell status-{worst}' data-build='{_e(build)}' data-family='{_e(fam)}' "
                         f"data-worst='{worst}'>{_e(_cell_text(counts))}</td>")
        out.append(f"<tr><th><code>{_e(shown)}</code></th>{''.join(cells)}</tr>")
    out.append("</tbody></table>")
    metrics, sampled, with_metrics = page.plots.get(impl, (None, 0, 0))
    png = scatter_png(metrics, impl) if metrics is not None else None
    if png is None:
        out.append("<p class='noplot'>No compared tensors (nothing ran to completion).</p>")
    else:
        shown = plottable(metrics)
        left_out = len(metrics) - len(shown)
        zeros = int((shown["max_abs_err"] == 0).sum())
        sample = (f" of {sampled} of the {with_metrics} records (a sample, those out of tolerance first)"
                  if sampled < with_metrics else "")
        out.append(f"<figure><img class='plot' alt='error against tolerance for {_e(impl)}' "
                   f"src='data:image/png;base64,{base64.b64encode(png).decode()}'>"
                   f"<figcaption>{len(shown)} of {len(metrics)} compared tensors plotted{sample}"
                   + (f" ({left_out} left out: a structural mismatch, a non-finite value or a zero tolerance has no "
                      "place on a log-log plot; see the failing cases below)" if left_out else "")
                   + f"; {zeros} exact (drawn at the bottom). The tolerance is the one at the element with the "
                   "largest err/tol; circled in red: tensors out of tolerance (err/tol above 1).</figcaption></figure>")
    out.append("</section>")
    return "\n".join(out)


def _failing_table(page: Page) -> str:
    failing = page.failing
    out = [f"<section id='failing'><h2>Failing cases ({page.failing_total}, {page.failing_known} of them known "
           "issues)</h2>"]
    if failing.empty:
        out.append("<p>None.</p></section>")
        return "\n".join(out)
    more = _more(len(failing), page.failing_total, "failing records", page.store_dir)
    if more:
        out.append(f"<p class='more'>The first {len(failing)}, unexpected failures first. {_e(more)}.</p>")
    out.append("<table class='failing'><thead><tr><th>impl</th><th>build</th><th>case</th><th>status</th>"
               "<th>ranks</th><th>worst err/tol</th><th>message</th></tr></thead><tbody>")
    for _, row in failing.iterrows():
        ratio = row["worst_ratio"]
        ratio_s = "" if ratio is None or (isinstance(ratio, float) and math.isnan(ratio)) else f"{ratio:.3g}"
        known = ""
        if row["known_issue"]:
            link = str(row["known_link"])
            known = (f" (<a href='{_e(link)}'>known issue</a>)" if link.startswith(("https://", "http://"))
                     else " (known issue)")
        out.append(f"<tr class='status-row' data-status='{_e(row['status'])}'><td>{_e(row['impl'])}</td>"
                   f"<td><code>{_e(row['build'])}</code></td><td><code>{_e(row['case'])}</code></td>"
                   f"<td class='cell status-{'known' if row['known_issue'] else _e(row['status'])}'>"
                   f"{_e(row['status'])}{known}</td>"
                   f"<td>{_e(row['ranks'])}</td><td>{ratio_s}</td><td class='msg'>{_e(row['message'])}"
                   f"{_said(row)}</td></tr>")
    out.append("</tbody></table></section>")
    return "\n".join(out)


def _said(row) -> str:
    """What the ranks said (their collectives) and what a debug re-run said, folded under the message."""
    out = ""
    if row.get("collectives"):
        out += f"<details><summary>collectives per rank</summary>{_e(row['collectives'])}</details>"
    if row.get("diagnosis"):
        out += f"<details><summary>TORCH_DISTRIBUTED_DEBUG=DETAIL re-run</summary>{_e(row['diagnosis'])}</details>"
    return out


def default_out() -> str:
    """Where reports go by default: $SYNCBN_HARNESS_REPORTS or ./reports."""
    from harness.paths import default_reports

    return default_reports()
