"""The history's page: Markdown and a self-contained HTML page from one committed history file.

:func:`sections` turns a :class:`~harness.history.table.History`, the
known-issues entries and the upstream changes into tables (a
:class:`Section` each): the releases and what happened to each; families
against releases, per implementation; each known issue against the releases
(``■`` shows, ``·`` its cases ran and it does not show) with the verdict of
its stated range; every status change between consecutive releases with the
change that explains it or ``unexplained``; and each upstream change against
the release the history shows it in. :func:`markdown` and :func:`html` render
the same sections, so the two pages cannot say different things.
"""

from __future__ import annotations

import html as html_mod
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import Version

from harness.history import changes as changes_mod
from harness.history import fixes as fixes_mod
from harness.history import ranges
from harness.history.ranges import FAILED, NOT_RUN
from harness.history.table import History
from harness.results.known_issues import KnownIssue



@dataclass
class Section:
    """One table of the page, with the sentences before it."""

    title: str
    intro: str
    header: list[str]
    rows: list[list[str]] = field(default_factory=list)


def _short(link: str) -> str:
    """``pytorch/pytorch#74944`` for a GitHub issue or pull request link; the link itself otherwise."""
    parts = link.split("github.com/", 1)[-1].split("/")
    if "github.com/" in link and len(parts) >= 4 and parts[2] in ("issues", "pull"):
        return f"{parts[0]}/{parts[1]}#{parts[3]}"
    return link.split("://", 1)[-1][:60]


def _cell(statuses: Counter, known: int) -> str:
    if not statuses:
        return "–"
    passed = statuses.get("pass", 0)
    failed = sum(statuses.get(s, 0) for s in FAILED) - known
    not_run = sum(statuses.get(s, 0) for s in NOT_RUN)
    return f"{passed}/{known}/{failed}/{not_run}"


def releases_section(history: History, entries: tuple[KnownIssue, ...]) -> Section:
    sec = Section("Releases", "Each release's environment, what ran and what it cost. Records are the latest of each "
                  "(implementation, case); known: failures the known-issues file explains (as it reads now); "
                  "failed: the others; not run: skipped or unsupported, each with its reason in the records.",
                  ["release", "torch build", "outcome", "records", "pass", "known", "failed", "not run",
                   "environment", "install", "run"])
    for r in history.ordered_releases():
        o = history.releases[r]
        rows = [x for x in history.rows if x.release == r]
        counts = Counter(x.status for x in rows)
        known = sum(1 for x in rows if ranges.known(x, entries))
        build = f"{o.torch_version} ({(o.torch_git_version or '')[:12]})" if o.torch_version else "–"
        sec.rows.append([r, build, "stored" if o.status == "stored" else f"not run: {o.reason}", str(len(rows)),
                         str(counts.get("pass", 0)), str(known),
                         str(sum(counts.get(s, 0) for s in FAILED) - known),
                         str(sum(counts.get(s, 0) for s in NOT_RUN)),
                         f"{o.env_bytes / 2**30:.1f} GiB", f"{o.install_s:.0f} s", f"{o.run_s:.0f} s"])
    return sec


def family_sections(history: History, entries: tuple[KnownIssue, ...]) -> list[Section]:
    stored = history.stored()
    out = []
    for impl in sorted({x.impl for x in history.rows}):
        cells: dict[tuple[str, str], Counter] = {}
        known: Counter = Counter()
        for x in history.rows:
            if x.impl == impl:
                cells.setdefault((x.family, x.release), Counter())[x.status] += 1
                known[(x.family, x.release)] += ranges.known(x, entries)
        sec = Section(f"Families against releases: {impl}", "Each cell: pass/known/failed/not run, as in the "
                      "releases table.", ["family", *stored])
        for family in sorted({f for f, _ in cells}):
            sec.rows.append([family, *(_cell(cells.get((family, r), Counter()), known[(family, r)]) for r in stored)])
        out.append(sec)
    return out


def known_section(history: History, entries: tuple[KnownIssue, ...]) -> Section:
    stored = history.stored()
    sec = Section("Known issues across releases", "One row per entry of cases/known_issues.toml: ■ the history "
                  "shows it on that release, · its cases ran and it does not show, blank: none of its cases ran. "
                  "Stated: the entry's releases; the verdict compares them with the history.",
                  ["known issue", "impl", "stated", *stored, "verdict"])
    for entry in entries:
        seen, ran = set(ranges.observed(entry, history)), set(ranges.ran(entry, history))
        problems = ranges.disagreements(entry, history)
        stated = (ranges.stated_range(entry.releases) if entry.releases
                  else f"not in the history: {entry.history_note}" if entry.history_note else "none stated")
        sec.rows.append([_short(entry.link), ", ".join(entry.impl), stated,
                         *("■" if r in seen else "·" if r in ran else "" for r in stored),
                         "; ".join(problems) or "agrees"])
    return sec


def changes_section(history: History, changes: list, entries: tuple[KnownIssue, ...]) -> Section:
    found = changes_mod.status_changes(history, changes, entries)
    sec = Section("Status changes between releases", f"{len(found)} (implementation, case) status changes between "
                  "consecutive releases, folded by what explains them: the upstream change released in between, "
                  "a known issue that begins or ends there, or unexplained.",
                  ["releases", "impl", "status", "cases", "example", "explained by"])
    for g in changes_mod.grouped(found):
        sec.rows.append([f"{g.before} → {g.after}", g.impl, f"{g.was} → {g.now}", str(g.count), g.example,
                         g.explanation])
    return sec


def fixes_section(history: History, changes: list) -> Section:
    sec = Section("Upstream changes against the history", "Each change of cases/torch_changes.toml: the first "
                  "release that contains it (expected), the first release where the history shows its cases "
                  "move from the statuses before it to those after it (observed), and the verdict.",
                  ["change", "title", "expected", "observed", "cases", "verdict"])
    for c in sorted(changes, key=lambda c: Version(c.release)):
        got = fixes_mod.check(c, history)
        sec.rows.append([c.name if c.pr is not None else _short(c.link), c.title,
                         got.expected or f"{c.release} (not in the history)",
                         got.observed or "no change seen", str(got.cases), got.verdict])
    return sec


def sections(history: History, entries: tuple[KnownIssue, ...], changes: list) -> list[Section]:
    """Every table of the page, in order."""
    return [releases_section(history, entries), *family_sections(history, entries),
            known_section(history, entries),
            changes_section(history, changes, entries), fixes_section(history, changes)]


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown(secs: list[Section], title: str, lead: str) -> str:
    """The page as Markdown."""
    out = [f"# {title}", "", lead, ""]
    for s in secs:
        out += [f"## {s.title}", "", s.intro, "", "| " + " | ".join(map(_md, s.header)) + " |",
                "|" + "---|" * len(s.header)]
        out += ["| " + " | ".join(map(_md, row)) + " |" for row in s.rows]
        out.append("")
    return "\n".join(out)


CSS = """body { font-family: sans-serif; margin: 1.5em; } table { border-collapse: collapse; margin-bottom: 1.5em; }
td, th { border: 1px solid #ccc; padding: 2px 6px; font-size: 13px; vertical-align: top; }
th { background: #eee; } td.shows { background: #f4b6b6; text-align: center; }
td.ran { background: #d8f0d0; text-align: center; } td.bad { background: #fde2a0; }"""


def _td(text: str) -> str:
    cls = {"■": "shows", "·": "ran"}.get(text, "bad" if text == "unexplained" else "")
    body = html_mod.escape(text)
    if text.startswith("http"):
        body = f"<a href='{body}'>{body}</a>"
    return f"<td class='{cls}'>{body}</td>" if cls else f"<td>{body}</td>"


def html(secs: list[Section], title: str, lead: str) -> str:
    """The page as one self-contained HTML file (inline CSS)."""
    out = ["<!DOCTYPE html>", "<html lang='en'><head><meta charset='utf-8'>", f"<title>{html_mod.escape(title)}"
           "</title>", f"<style>{CSS}</style></head><body>", f"<h1>{html_mod.escape(title)}</h1>",
           f"<p>{html_mod.escape(lead)}</p>"]
    for s in secs:
        out += [f"<h2>{html_mod.escape(s.title)}</h2>", f"<p>{html_mod.escape(s.intro)}</p>", "<table>",
                "<tr>" + "".join(f"<th>{html_mod.escape(h)}</th>" for h in s.header) + "</tr>"]
        out += ["<tr>" + "".join(_td(c) for c in row) + "</tr>" for row in s.rows]
        out.append("</table>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def write_page(history: History, out_dir: Path, entries: tuple[KnownIssue, ...], changes: list) -> list[Path]:
    """Write ``index.md`` and ``index.html`` of the history into ``out_dir``."""
    secs = sections(history, entries, changes)
    stored = history.stored()
    title = "SyncBN across PyTorch releases"
    lead = (f"The default selection of torch's SyncBatchNorm and the reference, on CPU over gloo (torch's Python "
            f"over CPU stand-ins for CUDA's kernels: cpu-emulation), on {len(stored)} of "
            f"{len(history.releases)} releases ({stored[0] if stored else '–'} to {stored[-1] if stored else '–'}). "
            "Made by `syncbn-harness report --history` from history.jsonl.gz beside this page.")
    out_dir.mkdir(parents=True, exist_ok=True)
    md, page = out_dir / "index.md", out_dir / "index.html"
    md.write_text(markdown(secs, title, lead), encoding="utf-8")
    page.write_text(html(secs, title, lead), encoding="utf-8")
    return [md, page]
