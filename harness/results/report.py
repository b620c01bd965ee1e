"""Reports over the store: a self-contained HTML page and a Markdown summary (CSV per build on request).

What they show is gathered from the store's index in bounded memory
(:mod:`harness.results.page`: counts by SQL, only the records shown read back)
from the latest record of each (build, impl, case) (a re-run supersedes
earlier records):

- Per implementation, a build x case-family matrix (builds by key, but an
  overlay bisection's in their commits' order on the branch, approximate ones
  marked ``~``: :mod:`harness.results.timeline`): each cell holds the
  counts per status and is colored by its worst status (:data:`SEVERITY`);
  failures the known-issues file expects count as ``known`` (their own
  color), so a cell is red only for what is new.
- The failing cases (the first :data:`~harness.results.page.MAX_FAILING`,
  unexpected ones first; the page says how many more and how to list them)
  with their messages, the ranks to blame, what each rank said (its
  collectives, :mod:`harness.results.fingerprint`), the first collective the
  ranks disagreed on, and what a debug re-run said.
- The compiled cases (``torch.compile``): per record the options, graphs,
  graph breaks, frames run eagerly, recompiles and the comparison with the
  eager run (:mod:`harness.results.compile_stats`), the reasons folded under.
- Error against tolerance, per tensor, log-log (:mod:`harness.results.plots`),
  one plot per implementation over a sample of its records, one color per
  build; points above the diagonal failed.
- With ``csv``, per build its latest records and their compared tensors
  (:mod:`harness.results.frames`), one build in memory at a time.

Every value that comes from a record or an implementation is escaped
(:func:`_e`, ``html.escape`` with quotes).
The HTML has no external script, style, font or image: CSS is inline and
plots are PNG ``data:`` URIs, so the file can be attached to an issue or
archived by CI as one artifact. The Markdown fits a CI job summary.
"""

from __future__ import annotations

import base64
import html
import math
from dataclasses import dataclass
from pathlib import Path

from harness import __version__
from harness.errors import HarnessError
from harness.results import compile_stats, timeline
from harness.results.page import FAILING, Page, gather, write_csv
from harness.results.plots import plottable, scatter_png
from harness.judge.status import FAILURES, WORST_FIRST

# Worst first: a cell takes the color of its worst status; "known" is a failure the known-issues file expects.
SEVERITY = FAILING + ("known",) + tuple(s.value for s in WORST_FIRST if s not in FAILURES)
COLORS = {
    "crash": "#8b0000", "hang": "#6a1b9a", "error": "#d32f2f", "mismatch": "#f57c00", "known": "#5c7080",
    "pass": "#2e7d32", "unsupported": "#9e9e9e", "skipped": "#cfd8dc",
}
LEGEND = {"known": "known issue (expected failure)"}


class ReportError(HarnessError):
    """The output directory cannot be written (exit 3)."""


@dataclass
class ReportFiles:
    """Paths of what :func:`write_report` wrote."""

    html: Path
    markdown: Path
    csv: list[Path]  # per build, with --csv


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
        lines += ["Unexpected failures first, then worst first; severity is the kind of failure and the "
                  "configurations it reaches.", "",
                  "| impl | build | case | status | severity | ranks | message |", "|---|---|---|---|---|---|---|"]
        for _, row in failing.head(max_failures).iterrows():
            known = ""
            if row["known_issue"]:
                known = f" ([known]({row['known_link']}))" if row["known_link"] else " (known)"
            status = f"{row['status']}{known}" if row["known_issue"] else f"**{row['status']}**"
            said = f" ({row['confirmation']})" if row.get("confirmation") else ""
            lines.append(f"| {row['impl']} | `{row['build']}` | `{row['case']}` | {status} | "
                         f"{_md(row['severity'])}{_md(said)} | {_md(row['ranks'])} | "
                         f"{_md(_first_line(row['message'], 160))} |")
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
    out.append("<p>Unexpected failures first, then worst first (severity: the kind of failure, and the "
               "configurations it reaches).</p>")
    out.append("<table class='failing'><thead><tr><th>impl</th><th>build</th><th>case</th><th>status</th>"
               "<th>severity</th><th>ranks</th><th>worst err/tol</th><th>message</th></tr></thead><tbody>")
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
                   f"<td>{_e(row['severity'])}<br><small>{_e(row['in_training'])}</small>"
                   f"{'<br><em>' + _e(row['confirmation']) + '</em>' if row.get('confirmation') else ''}</td>"
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
