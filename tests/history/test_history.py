"""The history's pure parts: which releases, the known issues' ranges, the status changes and what explains
them, the upstream changes against the history, the history file and its page."""

from __future__ import annotations

import textwrap

import pytest

from harness.errors import UsageError
from harness.history import changes, fixes, page, ranges, table
from harness.history.collect import ReleaseOutcome
from harness.history.releases import minor_releases, newest_installable
from harness.history.table import History, Row
from harness.results import known_issues

RELEASES = ["1.13.1", "2.0.1", "2.1.2"]


def test_the_newest_patch_of_each_minor_release_is_chosen_cpu_builds_first():
    offered = ["2.15.0", "2.14.1", "2.14.0", "2.13.0+cpu", "2.13.0", "2.12.1", "2.12.0", "2.2.0rc1", "2.1.2",
               "2.1.0", "2.0.1", "1.13.1", "1.13.0", "1.12.1", "2.14.1+cu130"]
    assert minor_releases(offered, "1.13", "2.14.1") == ["1.13.1", "2.0.1", "2.1.2", "2.12.1", "2.13.0+cpu",
                                                         "2.14.1"]
    assert minor_releases(offered, "2.12", "2.14.0") == ["2.12.1", "2.13.0+cpu", "2.14.0"]
    with pytest.raises(UsageError, match="is empty"):
        minor_releases(offered, "2.14", "2.1")
    with pytest.raises(UsageError, match="give versions such as"):
        minor_releases(offered, "one", "2.1")


def test_the_newest_installable_torch_is_what_pip_resolves_here():
    from packaging.version import Version

    assert Version(newest_installable()) >= Version("2.13.0")


def _entries(tmp_path, body: str):
    path = tmp_path / "known.toml"
    path.write_text(textwrap.dedent(body))
    known_issues.load.cache_clear()
    return known_issues.load(str(path))


ENTRY = """
    [[issue]]
    impl = "torch"
    cases = ["fam/*"]
    torch = "{spec}"
    status = "error"
    symptoms = ["error RuntimeError: counts*"]
    link = "https://github.com/pytorch/pytorch/pull/98332"
    releases = {releases}
"""


def _history(statuses: dict[str, str], case: str = "fam/a") -> History:
    rows = [Row(release=r, impl="torch", case=case, family="fam", status=s, torch_version=r,
                failures=("error RuntimeError: counts of the wrong type",) if s == "error" else ())
            for r, s in statuses.items()]
    return History({r: ReleaseOutcome(r, "stored") for r in statuses}, rows)


def test_a_stated_range_agrees_only_with_the_releases_where_the_history_shows_the_issue(tmp_path):
    h = _history({"1.13.1": "error", "2.0.1": "error", "2.1.2": "pass"})
    good = _entries(tmp_path, ENTRY.format(spec="<2.1", releases='["1.13.1", "2.0.1"]'))[0]
    assert ranges.observed(good, h) == ["1.13.1", "2.0.1"]
    assert ranges.disagreements(good, h) == []
    wrong = _entries(tmp_path, ENTRY.format(spec=">=1.13", releases='["1.13.1", "2.1.2"]'))[0]
    said = " ".join(ranges.disagreements(wrong, h))
    assert 'give releases = ["1.13.1", "2.0.1"]' in said
    assert "admits 2.1.2" in said  # the specifier would mark a passing release's failures as known
    narrow = _entries(tmp_path, ENTRY.format(spec="<2.0", releases='["1.13.1", "2.0.1"]'))[0]
    assert "leaves out 2.0.1" in " ".join(ranges.disagreements(narrow, h))


def test_a_gap_between_the_first_and_last_release_is_a_disagreement(tmp_path):
    h = _history({"1.13.1": "error", "2.0.1": "pass", "2.1.2": "error"})
    entry = _entries(tmp_path, ENTRY.format(spec=">=1.13", releases='["1.13.1", "2.1.2"]'))[0]
    assert any("not on 2.0.1 between" in d for d in ranges.disagreements(entry, h))


def test_an_entry_the_history_cannot_see_says_why_and_disagrees_when_it_shows_after_all(tmp_path):
    entry = _entries(tmp_path, ENTRY.format(spec=">=1.13", releases='"apex is not installed in the history"'))[0]
    assert entry.releases is None and entry.history_note.startswith("apex")
    assert ranges.disagreements(entry, _history({"1.13.1": "pass", "2.0.1": "pass"})) == []
    assert "it shows on 2.0.1" in ranges.disagreements(entry, _history({"1.13.1": "pass", "2.0.1": "error"}))[0]


@pytest.mark.parametrize("value", ['["2.1.2"]', '["2.1.2", "1.13.1"]', '["two", "2.1.2"]', "3"])
def test_a_malformed_range_is_refused_naming_the_value_and_the_form(tmp_path, value):
    with pytest.raises(UsageError, match=r"releases = .*give \[\"FIRST\", \"LAST\"\]"):
        _entries(tmp_path, ENTRY.format(spec=">=1.13", releases=value))


CHANGE = """
    [[change]]
    pr = 98332
    link = "https://github.com/pytorch/pytorch/pull/98332"
    title = "cast the counts"
    release = "2.1.0"
    impl = "torch"
    cases = ["fam/*"]
    before = "error"
    after = "pass"
    {verdict}
"""


def _changes(tmp_path, verdict: str = "") -> list:
    path = tmp_path / "changes.toml"
    path.write_text(textwrap.dedent(CHANGE.format(verdict=verdict)))
    return fixes.load(path)


def test_an_upstream_change_agrees_when_the_history_shows_it_at_its_first_release(tmp_path):
    [change] = _changes(tmp_path)
    got = fixes.check(change, _history({"1.13.1": "error", "2.0.1": "error", "2.1.2": "pass"}))
    assert (got.expected, got.observed, got.cases, got.verdict) == ("2.1.2", "2.1.2", 1, "agrees")
    late = fixes.check(change, _history({"1.13.1": "error", "2.0.1": "error", "2.1.2": "error", "2.2.2": "pass"}))
    assert (late.observed, late.verdict) == ("2.2.2", "unexplained")
    [explained] = _changes(tmp_path, 'verdict = "backported to 2.0.1"')
    early = fixes.check(explained, _history({"1.13.1": "error", "2.0.1": "pass", "2.1.2": "pass"}))
    assert (early.observed, early.verdict) == ("2.0.1", "backported to 2.0.1")


def test_a_changes_file_without_a_field_is_refused_naming_it(tmp_path):
    path = tmp_path / "changes.toml"
    path.write_text('[[change]]\npr = 1\n')
    with pytest.raises(UsageError, match="change #1 lacks link"):
        fixes.load(path)


def test_every_status_change_is_explained_by_a_change_a_known_issue_or_unexplained(tmp_path):
    cs = _changes(tmp_path)
    entries = _entries(tmp_path, ENTRY.format(spec="<2.1", releases='["1.13.1", "2.0.1"]'))
    h = _history({"1.13.1": "error", "2.0.1": "error", "2.1.2": "pass"})
    [c] = changes.status_changes(h, cs, entries)
    assert c.explained and c.explanation.startswith("#98332 cast the counts")
    [c] = changes.status_changes(h, [], entries)
    assert c.explanation == "known issue ends: https://github.com/pytorch/pytorch/pull/98332"
    h2 = _history({"1.13.1": "pass", "2.0.1": "mismatch", "2.1.2": "mismatch"})
    [c] = changes.status_changes(h2, cs, entries)
    assert (c.explained, c.explanation, c.after.release) == (False, "unexplained", "2.0.1")
    [g] = changes.grouped(changes.status_changes(h2, cs, entries))
    assert (g.before, g.after, g.was, g.now, g.count, g.example) == ("1.13.1", "2.0.1", "pass", "mismatch", 1, "fam/a")


def test_the_history_file_reads_back_as_written_and_the_same_history_gives_the_same_bytes(tmp_path):
    h = _history({"1.13.1": "error", "2.0.1": "pass"})
    h.releases["2.0.1"] = ReleaseOutcome("2.0.1", "failed", reason="install failed: see /root/x/2.0.1.install.log)")
    a = table.write(tmp_path / "a" / "history.jsonl.gz", h)
    b = table.write(tmp_path / "b" / "history.jsonl.gz", h)
    assert a.read_bytes() == b.read_bytes()
    back = table.read(a)
    assert back.rows == h.rows
    assert back.stored() == ["1.13.1"]
    assert back.releases["2.0.1"].reason == "install failed: see 2.0.1.install.log"  # no machine path


def test_the_page_says_the_same_in_markdown_and_html(tmp_path):
    entries = _entries(tmp_path, ENTRY.format(spec="<2.1", releases='["1.13.1", "2.0.1"]'))
    h = _history({"1.13.1": "error", "2.0.1": "error", "2.1.2": "pass"})
    md, html = page.write_page(h, tmp_path / "out", entries, _changes(tmp_path))
    text = md.read_text()
    assert "| pytorch/pytorch#98332 | torch | 1.13.1..2.0.1 | ■ | ■ | · | agrees |" in text
    assert "| 2.0.1 → 2.1.2 | torch | error → pass | 1 | fam/a | #98332 cast the counts" in text
    assert "| #98332 | cast the counts | 2.1.2 | 2.1.2 | 1 | agrees |" in text
    assert "| fam | 0/1/0/0 | 0/1/0/0 | 1/0/0/0 |" in text  # pass/known/failed/not run, known as the file says now
    page_html = html.read_text()
    assert "<td class='shows'>■</td>" in page_html and "cast the counts" in page_html


def test_the_command_lists_its_releases_and_refuses_an_empty_range_or_a_folder_that_is_no_history(tmp_path):
    from cli_here import run_here

    listed = run_here(["history", "--store", tmp_path / "s", "--first", "2.12", "--last", "2.13.0", "--dry-run"])
    assert listed.returncode == 0 and listed.stdout.strip() == "history of 2 releases: 2.12.1, 2.13.0+cpu"
    assert not (tmp_path / "s").exists()
    empty = run_here(["history", "--store", tmp_path / "s", "--first", "2.14", "--last", "2.1", "--dry-run"])
    assert empty.returncode == 2 and "release range 2.14..2.1 is empty" in empty.stderr
    (tmp_path / "plain").mkdir()
    refused = run_here(["report", "--history", tmp_path / "plain", "--out", tmp_path / "out"])
    assert refused.returncode == 2 and "holds no history.json" in refused.stderr
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "history.json").write_text("{not json")
    broken = run_here(["report", "--history", tmp_path / "s", "--out", tmp_path / "out"])
    assert broken.returncode == 2 and "is not a history manifest" in broken.stderr
    assert (tmp_path / "s" / "history.json").read_text() == "{not json"  # nothing stored is lost


def test_a_case_that_could_not_run_on_one_side_is_explained_by_its_records_reason(tmp_path):
    h = _history({"1.13.1": "unsupported", "2.0.1": "pass"})
    h.rows[0] = Row(**{**h.rows[0].__dict__, "message": "torch 1.13.1 has no torch.compile (torch >= 2.0)"})
    [c] = changes.status_changes(h, [], ())
    assert c.explained and c.explanation == "not run on 1.13.1: torch 1.13.1 has no torch.compile (torch >= 2.0)"


def test_one_known_issue_on_both_sides_with_another_status_is_the_same_defect(tmp_path):
    entries = _entries(tmp_path, ENTRY.format(spec=">=1.13", releases='["1.13.1", "2.0.1"]').replace(
        'status = "error"', 'status = ["error", "crash"]').replace('symptoms = [', 'symptoms = ["crash SIG*", '))
    h = _history({"1.13.1": "error", "2.0.1": "crash"})
    h.rows[1] = Row(**{**h.rows[1].__dict__, "failures": ("crash SIGABRT",)})
    [c] = changes.status_changes(h, [], entries)
    assert c.explanation == "one known issue, another of its symptoms: https://github.com/pytorch/pytorch/pull/98332"


def _record_many(store: str, first: int) -> None:
    from harness.history.collect import record_outcome

    for i in range(first, first + 15):
        record_outcome(store, ReleaseOutcome(f"2.{i}.0", "stored"))


def test_two_histories_over_one_store_keep_each_others_releases(tmp_path):
    import multiprocessing

    from harness.history.collect import read_manifest

    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_record_many, args=(str(tmp_path), first)) for first in (0, 15)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    assert sorted(read_manifest(tmp_path), key=lambda r: int(r.split(".")[1])) == [f"2.{i}.0" for i in range(30)]


def test_a_release_that_is_no_version_is_refused_before_anything_is_made(tmp_path):
    from cli_here import run_here

    refused = run_here(["history", "--store", tmp_path / "s", "--release", "latest"])
    assert refused.returncode == 2 and "--release 'latest' is not a torch version" in refused.stderr
    assert not (tmp_path / "s").exists()
