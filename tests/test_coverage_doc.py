"""docs/coverage.md, the table of upstream SyncBN defects, held to the code it cites.

Design: the page's tables are read as data (one row per root cause: links, defect, reach, upstream,
status, evidence) and every claim a row makes about this repository is checked where it lives:

- every row has a link, no link heads two rows, its reach and status are of the sets the page
  defines (``pending: cases-a`` and the like for the other branches' planned cases);
- in the evidence cell, a backticked ``family/...`` pattern must match at least one case of the
  exhaustive catalog (``harness.catalog.all_cases``); ``known: [..](URL)`` must be the link of an
  entry of ``cases/known_issues.toml``, ``change: [..](URL)`` of ``cases/torch_changes.toml``; a
  relative link into ``findings/`` must name a file that exists; ``tests/support/FILE.py:Class``
  must name a class defined there; ``undone: prNNNN`` (a change of ``cases/syncbn_fixes.toml`` undone on the
  installed build by ``syncbn-harness undo fixes``) must be a row of the committed sweep,
  ``docs/torch-fixes/fixes.json``, that a case caught (its ``case``) or that says why it needs none (its
  ``reason``), and the change must be one whose link or fixed issue heads the row citing it;
- a ``shown`` row cites some evidence, a ``reached`` row a case, a pending row what is planned;
- the figure the page states (CPU-reachable rows shown, of those that are defects) and its count of rows
  by status are the ones the table gives.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import re
from dataclasses import dataclass
from pathlib import Path

from harness import catalog
from harness.undo import fixes

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "coverage.md"
HEADER = "| links | defect (trigger: symptom) | reach | upstream | status | evidence |"
REACH = {"cpu", "gpu", "2gpu", "xpu", "rocm", "adapter"}
STATUSES = {"shown", "reached", "gap", "out of reach", "not a defect"}
HELPERS = {"cases-a", "cases-b", "cases-c"}
FIGURE = re.compile(r"\*\*CPU-reachable rows shown: (\d+) of (\d+) \((\d+)%\)\.\*\*")
COUNTS = re.compile(r"(\d+) rows: (\d+) shown, (\d+) reached, (\d+) pending, (\d+) gap,\s+(\d+) out of reach, "
                    r"(\d+) not a defect\.")
LINK = re.compile(r"\[[^\]]+\]\(([^)\s]+)\)")
TAGGED = re.compile(r"(known|change): \[[^\]]+\]\(([^)\s]+)\)")
TICKED = re.compile(r"`([^`]+)`")
PLANTED = re.compile(r"^(tests/support/[\w/]+\.py):(\w+)$")
UNDONE = re.compile(r"undone: (pr\d+(?:-\d+)?)\b")
SWEEP = ROOT / "docs" / "torch-fixes" / "fixes.json"


@dataclass
class Row:
    section: str
    line: int
    links: list[str]
    defect: str
    reach: str
    upstream: str
    status: str
    evidence: str


def rows() -> list[Row]:
    """Every row of every table of the page whose header is :data:`HEADER`, with the section it is in."""
    out, section, in_table = [], "", False
    for n, line in enumerate(PAGE.read_text().splitlines(), start=1):
        if line.startswith("## "):
            section, in_table = line[3:], False
        elif line.strip() == HEADER:
            in_table = True
        elif in_table and line.startswith("|") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            assert len(cells) == 6, f"line {n}: {len(cells)} cells, not 6: {line}"
            links = [u for u in LINK.findall(cells[0]) if u.startswith("https://")]
            out.append(Row(section, n, links, *cells[1:]))
        elif in_table and not line.startswith("|"):
            in_table = False
    return out


def case_patterns(evidence: str) -> list[str]:
    """The backticked case patterns of an evidence cell: ``family/...`` for a family of the catalog."""
    families = set(catalog.families())
    return [t for t in TICKED.findall(evidence) if "/" in t and t.split("/", 1)[0] in families]


def toml_links(name: str, table: str) -> set[str]:
    with open(ROOT / "cases" / name, "rb") as f:
        return {entry["link"] for entry in tomllib.load(f)[table]}


def is_defect_on_cpu(row: Row) -> bool:
    return row.reach == "cpu" and row.status != "not a defect"


def test_the_page_has_rows_in_every_section_it_groups_by():
    table = rows()
    assert len(table) >= 76, f"only {len(table)} rows: the table lost rows"
    sections = {r.section for r in table}
    assert any(s.startswith("torch") for s in sections) and any(s.startswith("apex") for s in sections)


def test_every_row_has_links_a_reach_and_a_status_of_the_defined_sets():
    for r in rows():
        assert r.links, f"line {r.line}: a row with no upstream link"
        assert r.defect, f"line {r.line}: a row that says nothing of the defect"
        assert r.reach in REACH, f"line {r.line}: reach {r.reach!r} is not one of {sorted(REACH)}"
        if r.status.startswith("pending: "):
            helper = r.status[len("pending: "):]
            assert helper in HELPERS, f"line {r.line}: pending on {helper!r}, not one of {sorted(HELPERS)}"
            assert r.evidence.startswith("planned: "), f"line {r.line}: a pending row names the planned case"
        else:
            assert r.status in STATUSES, f"line {r.line}: status {r.status!r} is not one of {sorted(STATUSES)}"


def test_no_link_heads_two_rows():
    seen: dict[str, int] = {}
    for r in rows():
        for url in r.links:
            assert url not in seen, f"{url} heads the rows of lines {seen[url]} and {r.line}: fold them into one"
            seen[url] = r.line


def test_every_cited_case_pattern_matches_a_case_of_the_exhaustive_catalog():
    ids = [c.id for c in catalog.all_cases()]
    cited = 0
    for r in rows():
        for pattern in case_patterns(r.evidence):
            cited += 1
            assert any(fnmatch.fnmatchcase(i, pattern) for i in ids), (
                f"line {r.line}: `{pattern}` matches no case of the exhaustive catalog")
    assert cited > 50


def test_every_known_issue_and_change_cited_is_an_entry():
    known = toml_links("known_issues.toml", "issue")
    changes = toml_links("torch_changes.toml", "change")
    for r in rows():
        for kind, url in TAGGED.findall(r.evidence):
            entries = known if kind == "known" else changes
            where = "cases/known_issues.toml" if kind == "known" else "cases/torch_changes.toml"
            assert url in entries, f"line {r.line}: {kind}: {url} is no entry of {where}"


def test_every_findings_file_and_planted_defect_cited_exists():
    for r in rows():
        for target in LINK.findall(r.evidence):
            if target.startswith("findings/"):
                assert (PAGE.parent / target).is_file(), f"line {r.line}: {target} does not exist"
        for token in TICKED.findall(r.evidence):
            m = PLANTED.match(token)
            if not m:
                continue
            path = ROOT / m.group(1)
            assert path.is_file(), f"line {r.line}: {m.group(1)} does not exist"
            classes = {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)}
            assert m.group(2) in classes, f"line {r.line}: {m.group(1)} defines no class {m.group(2)}"


def test_shown_and_reached_rows_cite_what_shows_or_reaches_them():
    for r in rows():
        cases = case_patterns(r.evidence)
        if r.status == "reached":
            assert cases, f"line {r.line}: a reached row names the cases that exercise it"
        if r.status == "shown":
            files = [t for t in LINK.findall(r.evidence) if t.startswith("findings/")]
            planted = [t for t in TICKED.findall(r.evidence) if PLANTED.match(t)]
            assert cases or TAGGED.search(r.evidence) or files or planted or UNDONE.search(r.evidence), (
                f"line {r.line}: a shown row cites a failing case, an entry, a repro or an undone fix")


def test_the_figure_the_page_states_is_the_tables():
    table = rows()
    on_cpu = [r for r in table if is_defect_on_cpu(r)]
    shown = [r for r in on_cpu if r.status == "shown"]
    percent = round(100 * len(shown) / len(on_cpu))
    print(f"CPU-reachable rows shown: {len(shown)} of {len(on_cpu)} ({percent}%)")
    stated = FIGURE.search(PAGE.read_text())
    assert stated, "the page states its figure as **CPU-reachable rows shown: S of N (P%).**"
    assert tuple(int(g) for g in stated.groups()) == (len(shown), len(on_cpu), percent), (
        f"the page says {stated.group(0)}; the table gives {len(shown)} of {len(on_cpu)} ({percent}%)")
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"of the {len(on_cpu)} a CPU can reach, {len(shown)} are shown" in readme, (
        "README.md's figure (\"of the N a CPU can reach, S are shown\") is not this page's")
    counts = COUNTS.search(PAGE.read_text())
    assert counts, "the page states its counts as 'N rows: S shown, R reached, P pending, G gap, O out of reach, D ...'"
    statuses = [r.status.split(":")[0] for r in table]
    got = (len(table), *(statuses.count(s) for s in ("shown", "reached", "pending", "gap", "out of reach",
                                                      "not a defect")))
    assert tuple(int(g) for g in counts.groups()) == got, f"the page says {counts.group(0)!r}; the table gives {got}"


def test_every_undone_fix_cited_is_caught_in_the_committed_sweep_and_fixed_the_rows_defect():
    cited = [(r, ident) for r in rows() for ident in UNDONE.findall(r.evidence)]
    assert cited, "no row cites an undone fix: the page defines `undone: prNNNN` for the undo sweep's results"
    assert SWEEP.is_file(), (f"{SWEEP.relative_to(ROOT)} is not committed, but the page cites "
                             f"{', '.join(sorted({i for _, i in cited}))}: run "
                             "`syncbn-harness undo fixes --out docs/torch-fixes/fixes.json` and commit it")
    swept = json.loads(SWEEP.read_text())["rows"]
    changes = {f.id: f for f in fixes.load()}
    for r, ident in cited:
        assert ident in changes, f"line {r.line}: undone: {ident} is no change of cases/syncbn_fixes.toml"
        assert ident in swept, f"line {r.line}: undone: {ident} is no row of {SWEEP.relative_to(ROOT)}"
        got = swept[ident]
        assert got.get("case") or got.get("reason"), (
            f"line {r.line}: undone: {ident} was not caught in {SWEEP.relative_to(ROOT)} (no case, no reason)")
        change = changes[ident]
        assert {change.link, change.issue} & set(r.links), (
            f"line {r.line}: undone: {ident} fixed {change.issue or change.link}, which heads no link of this row")
