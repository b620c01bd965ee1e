"""Docs that name parts of the code are held to the code, so that they cannot drift.

- docs/development.md's layout table has one row per package of ``harness/`` (subpackages included), per
  module at its top, and for ``cases/`` and ``kernels/``; a row naming nothing there fails, as does a package
  or module without a row;
- the rule that page gives for ``tests/`` holds: a folder of tests is named for a package, a top-level test file
  for a top-level module, or it is one of the files that check the whole tree;
- the README's command table lists exactly the commands ``syncbn-harness --help`` lists, and a subcommand or a
  flag it names exists;
- ``harness/paths.py``'s docstring names every folder of the cache (``CACHE_FOLDERS`` is the truth).
"""

from __future__ import annotations

import re
from pathlib import Path

import click
from click.testing import CliRunner

from harness import paths
from harness.commands import cli, load_commands

ROOT = Path(__file__).resolve().parents[1]
DEVELOPMENT = ROOT / "docs" / "development.md"
README = ROOT / "README.md"
# Top-level test files that check the whole tree rather than one module (docs/development.md says which).
WHOLE_TREE = {"test_layout.py", "test_docs.py", "test_readme.py", "test_packaging.py", "test_bad_input.py",
              "test_coverage_doc.py"}
ROW = re.compile(r"^\|\s*`([^`]+)`")


def section(text: str, heading: str) -> list[str]:
    """The lines under the ``## heading`` of a Markdown page, up to the next heading of that level."""
    lines = text.splitlines()
    start = lines.index(f"## {heading}") + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start:end]


def table_after(lines: list[str], header: str) -> list[str]:
    """The first cells (backticked) of the rows of the table whose header line is ``header``."""
    start = next(i for i, line in enumerate(lines) if line.strip() == header)
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        m = ROW.match(line)
        assert m, f"a row whose first cell is not a `name`: {line}"
        rows.append(line)
    return rows


def package_tree() -> set[str]:
    """``harness/`` and each package under it (``harness/a/b/``), each module at its top (``harness/x.py``, not
    ``__init__``), ``cases/`` and ``kernels/``."""
    pkg = ROOT / "harness"
    found = {"harness/", "cases/", "kernels/"}
    found |= {f"{p.parent.relative_to(ROOT).as_posix()}/" for p in pkg.rglob("__init__.py")
              if "__pycache__" not in p.parts}
    found |= {f"harness/{p.name}" for p in pkg.glob("*.py") if p.name != "__init__.py"}
    return found


def test_the_layout_table_is_the_package_tree():
    rows = [ROW.match(line).group(1) for line in table_after(section(DEVELOPMENT.read_text(), "Layout"),
                                                               "| path | what it holds |")]
    assert len(rows) == len(set(rows)), f"a row twice: {sorted(r for r in rows if rows.count(r) > 1)}"
    tree = package_tree()
    assert not tree - set(rows), f"docs/development.md's layout has no row for {sorted(tree - set(rows))}"
    assert not set(rows) - tree, f"docs/development.md's layout names what is no package: {sorted(set(rows) - tree)}"


def test_the_tests_folder_follows_the_rule_the_layout_gives():
    tests = ROOT / "tests"
    packages = {p.parent.name for p in (ROOT / "harness").glob("*/__init__.py")} | {"kernels"}
    folders = {p.name for p in tests.iterdir() if p.is_dir() and p.name not in ("support", "__pycache__")}
    assert not folders - packages, f"test folders named for no package: {sorted(folders - packages)}"
    modules = {p.stem for p in (ROOT / "harness").glob("*.py")}
    loose = {p.name for p in tests.glob("test_*.py")}
    stray = {n for n in loose - WHOLE_TREE if n[len("test_"):-len(".py")] not in modules}
    assert not stray, (f"top-level test files named for no top-level module: {sorted(stray)}; move them into "
                       "tests/<package>/ (or add a whole-tree check to WHOLE_TREE and to docs/development.md)")
    text = " ".join(section(DEVELOPMENT.read_text(), "Layout"))
    assert all(f"`{n}`" in text for n in WHOLE_TREE), "docs/development.md names every whole-tree test file"


def help_commands() -> list[str]:
    """The commands ``syncbn-harness --help`` lists, read from its output."""
    load_commands()
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0, result.output
    listed = result.output.split("Commands:", 1)[1]
    return [line.split()[0] for line in listed.splitlines() if line.startswith("  ") and line.strip()]


def test_the_readme_command_table_lists_exactly_the_commands():
    rows = table_after(README.read_text().splitlines(), "| command | what it does |")
    named = [name.strip() for line in rows for name in re.findall(r"`([^`]+)`", line.split("|")[1])]
    commands = help_commands()
    tops = {n.split()[0] for n in named}
    assert not set(commands) - tops, f"README's command table omits {sorted(set(commands) - tops)}"
    assert not tops - set(commands), f"README's command table names no command: {sorted(tops - set(commands))}"
    ctx = click.Context(cli)
    for name in named:
        top, *rest = name.split()
        command = cli.get_command(ctx, top)
        for word in rest:
            if word.startswith("-"):
                flags = {f for p in command.params for f in getattr(p, "opts", [])}
                assert word in flags, f"README's command table: `{top}` has no flag {word}"
            else:
                assert isinstance(command, click.Group) and word in command.commands, \
                    f"README's command table: `{top}` has no subcommand {word!r}"
                command = command.commands[word]


def test_paths_docstring_names_every_cache_folder():
    doc = paths.__doc__
    missing = [f for f in paths.CACHE_FOLDERS.values() if f"``{f}/``" not in doc]
    assert not missing, f"harness/paths.py's docstring does not name the cache folders {missing}"
    named = set(re.findall(r"``([a-z]+)/``", doc.split("The cache's folders", 1)[1].split("Protocol:")[0]))
    assert named == set(paths.CACHE_FOLDERS.values()), sorted(named ^ set(paths.CACHE_FOLDERS.values()))
