"""Undoing one change of a file on a later version of it (harness.undo.hunks, harness.undo.fixes): pure, on texts
written here, each a three-release history of a small module."""

from __future__ import annotations

import textwrap

from harness.undo import fixes
from harness.undo.hunks import canonical, pick, undo

BEFORE = textwrap.dedent('''
    def gather(rows, counts):
        """Merge every rank's row."""
        total = sum(counts)
        return [r for r in rows], total
''')
# The change: rows of count 0 are dropped before the merge (and a comment).
AFTER = textwrap.dedent('''
    def gather(rows, counts):
        """Merge every rank's row."""
        # drop empty ranks
        rows = [r for r, c in zip(rows, counts) if c > 0]
        total = sum(counts)
        return [r for r in rows], total
''')
# A later release: reformatted, a new docstring, and a later change elsewhere in the function.
INSTALLED = textwrap.dedent('''
    def gather(rows, counts):
        """Merge the rows of every rank, in rank order."""
        rows = [r for r, c in zip(rows, counts) if c > 0]
        total = sum(counts,
                    0)
        return [r for r in rows], int(total)
''')


def test_canonical_drops_comments_docstrings_and_formatting():
    assert canonical(INSTALLED) == canonical(INSTALLED.replace("(counts,\n                    0)", "(counts, 0)"))
    assert '"""' not in canonical(AFTER) and "#" not in canonical(AFTER)


def test_markers_pick_the_change_and_it_is_undone_on_a_later_release_keeping_later_changes():
    assert len(pick(BEFORE, AFTER, ["if c > 0"])) == 1
    done = undo(INSTALLED, BEFORE, AFTER, ["if c > 0"])
    assert done.ok, done.reason
    assert "if c > 0" not in done.text
    assert "int(total)" in done.text and "sum(counts, 0)" in done.text  # the later change stays


def test_a_change_of_comments_or_docstrings_only_has_nothing_to_undo():
    docs_only = AFTER.replace("Merge every rank's row.", "Merge all rows.")
    done = undo(INSTALLED, AFTER, docs_only, ["Merge all rows."])
    assert not done.ok and "only comments, docstrings or formatting" in done.reason


def test_a_change_whose_lines_a_later_release_rewrote_is_reported_not_guessed():
    rewritten = INSTALLED.replace("if c > 0", "if c >= 1")
    done = undo(rewritten, BEFORE, AFTER, ["if c > 0"])
    assert not done.ok and "a later change rewrote it" in done.reason and "no longer in" in done.reason
    assert not undo(INSTALLED, BEFORE, AFTER, ["no such marker"]).ok


def test_a_line_found_twice_is_placed_by_the_lines_before_it():
    twice = textwrap.dedent('''
        def a(x):
            y = 1
            return x
        def b(x):
            y = 2
            return x
    ''')
    changed = twice.replace("    y = 2\n    return x", "    y = 2\n    x = x + y\n    return x")
    later = changed.replace("def a(x):", "def a(x, z=0):")
    done = undo(later, twice, changed, ["x = x + y"])
    assert done.ok, done.reason
    assert canonical(done.text) == canonical(twice.replace("def a(x):", "def a(x, z=0):"))


def test_edits_bring_back_old_behaviour_where_markers_cannot(tmp_path):
    for release, text in (("1.0", BEFORE), ("1.1", AFTER)):
        path = tmp_path / release / "torch/nn/modules/_functions.py"
        path.parent.mkdir(parents=True)
        path.write_text(text)
    (tmp_path / "1.0/torch/nn/modules/batchnorm.py").write_text("")
    fix = fixes.Fix(pr=1, link="l", title="t", kind="fix", release="1.1", previous="1.0",
                    file="torch/nn/modules/_functions.py", markers=("if c > 0",), behaviour="b",
                    edits=(("if c >= 1", "if True"),))
    rewritten = INSTALLED.replace("if c > 0", "if c >= 1")
    done, how = fixes.undone(fix, rewritten, tmp_path)
    assert done.ok and how == "edits" and "if True" in done.text
    missing = fixes.Fix(**{**fix.__dict__, "edits": (("not there", "x"),)})
    done, how = fixes.undone(missing, rewritten, tmp_path)
    assert not done.ok and "rewrote it" in done.reason and "'not there' is not in" in done.reason


def test_the_committed_changes_file_loads_and_names_each_change_once():
    entries = fixes.load()
    assert len(entries) >= 70
    assert {f.kind for f in entries} <= set(fixes.KINDS)
    ids = [(f.id, f.file) for f in entries]
    assert len(ids) == len(set(ids))


# The same lines in two methods (as _BatchNorm.forward and SyncBatchNorm.forward share their momentum factor):
# a change to one method is undone in that method, even where the lines before it in the release are next to the
# other method's copy in the installed file.
TWO_BEFORE = textwrap.dedent('''
    class Base:
        def forward(self, x):
            self.check(x)
            factor = self.momentum or 0.0
            return x * factor


    class Sync(Base):
        def forward(self, x):
            self.check(x)
            factor = 0.0
            return x * factor
''')
TWO_AFTER = TWO_BEFORE.replace("        factor = 0.0\n", "        factor = self.momentum or 0.0\n")
# Later, Sync.forward checks its channels first: the release's line before the change is now next to Base's copy.
TWO_INSTALLED = TWO_AFTER.replace("class Sync(Base):\n    def forward(self, x):\n        self.check(x)\n",
                                  "class Sync(Base):\n    def forward(self, x):\n        self.check(x)\n"
                                  "        self.check_channels(x)\n")


def test_a_change_is_undone_in_its_own_method_not_in_another_with_the_same_lines():
    assert TWO_INSTALLED.count("factor = self.momentum or 0.0") == 2 and "check_channels" in TWO_INSTALLED
    done = undo(TWO_INSTALLED, TWO_BEFORE, TWO_AFTER, ["factor = self.momentum"])
    assert done.ok, done.reason
    base, sync = done.text.split("class Sync")
    assert "factor = self.momentum or 0.0" in base  # the other method's copy stays
    assert "factor = 0.0" in sync and "self.momentum" not in sync
