"""The committed history (docs/history/) agrees with the known issues, the upstream changes and its own page.

The history file is what `syncbn-harness history` stored for every minor torch release from 1.13 on, cut
down by `report --history`; these tests read it and never need the store, so they run in the main suite.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.version import Version

from harness.history import fixes, page, ranges, table
from harness.results import known_issues

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "history"


@pytest.fixture(scope="module")
def history() -> table.History:
    return table.read(DOCS / "history.jsonl.gz")


def test_every_minor_release_from_1_13_is_in_the_history_and_none_was_dropped(history):
    minors = {Version(r).release[:2] for r in history.ordered_releases()}
    newest = max(minors)
    assert newest >= (2, 14)
    assert minors == {(1, 13)} | {(2, m) for m in range(newest[1] + 1)}
    for release, outcome in history.releases.items():
        assert outcome.status == "stored" or outcome.reason, release  # a release that failed says why
    assert len(history.stored()) == len(history.releases)


def test_every_known_issue_states_its_releases_and_they_agree_with_the_history(history):
    known_issues.load.cache_clear()
    entries = known_issues.load()
    unstated = [e.link for e in entries if e.releases is None and not e.history_note]
    assert not unstated, "entries with neither releases nor a reason the history cannot show them"
    wrong = {f"#{i + 1} {e.link}": ranges.disagreements(e, history) for i, e in enumerate(entries)}
    assert not {k: v for k, v in wrong.items() if v}


def test_every_upstream_change_shows_at_its_release_or_the_disagreement_is_explained(history):
    checks = [fixes.check(c, history) for c in fixes.load()]
    assert checks
    assert not [(c.change.name, c.expected, c.observed) for c in checks if c.verdict == "unexplained"]


def test_the_committed_page_is_the_rendering_of_the_committed_history(history, tmp_path):
    known_issues.load.cache_clear()
    page.write_page(history, tmp_path, known_issues.load(), fixes.load())
    for name in ("index.md", "index.html"):
        assert (DOCS / name).read_text() == (tmp_path / name).read_text(), (
            f"docs/history/{name} is stale: run `syncbn-harness report --history docs/history/history.jsonl.gz "
            "--out docs/history`")
