"""The README and the user guide in docs/: what they show must hold for the code as it is.

- Every ``syncbn-harness ...`` command in a code block of README.md or docs/*.md, and in every inline
  code span that runs it (``PYTHONPATH=... syncbn-harness run ...``), names a command that exists and
  flags it accepts:
  click parses it (``make_context``), nothing runs. In a block with ``$`` prompts only the prompted
  lines are commands (the rest is output); a line ending in ``\\`` continues on the next; the
  command ends at the first unquoted ``|``, ``;``, ``&&``, ``||``, redirection or ``#`` comment.
  ``python -m harness ...`` and ``torchrun ... -m harness ...`` count as the same CLI. A usage
  synopsis (a line with ``[--flag ...]``) is checked flag by flag. Placeholders (``CASE``,
  ``GOOD_SHA``, ``~/pytorch``) parse as the strings they are; paths are not required to exist.
- The README's "two commands" block holds exactly the two lines users run and CI runs.
- No README line is wider than 100 columns, except those two commands and lines that fit once
  their URLs are taken out; the first screen (40 lines) holds the title and the two commands.
- Relative links between the pages resolve, to files and to headings; every docs page links back
  to the README in its first paragraph, and the README links every docs page.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]

RUN_COMMAND = ("python3 -m venv .venv && .venv/bin/pip install --no-compile torch==2.13.0 -e . && "
               ".venv/bin/syncbn-harness run --device cpu")
TEST_COMMAND = ("python3 -m venv .venv && .venv/bin/pip install --no-compile torch==2.13.0 -e '.[test]' && "
                ".venv/bin/python -m pytest -n 2")
MAX_WIDTH = 100
FIRST_SCREEN = 40

FENCE = re.compile(r"^\s*```")
URL = re.compile(r"https?://\S+")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
INLINE_COMMAND = re.compile(r"`([^`]*(?<![\w-])syncbn-harness(?:\s[^`]*)?)`")
FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")
PLACEHOLDER = re.compile(r"<[A-Za-z][^<>]*>")  # <pid>, <the GPUs' architectures>: one word, not a redirection


# ---------------------------------------------------------------------- reading the pages


def blocks(text: str):
    """(first line number, lines) of every fenced code block, and the prose with the blocks blanked."""
    out, prose, current, start = [], [], None, 0
    for n, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            if current is None:
                current, start = [], n + 1
            else:
                out.append((start, current))
                current = None
            prose.append("")
        elif current is not None:
            current.append(line)
            prose.append("")
        else:
            prose.append(line)
    assert current is None, f"a code block opened at line {start - 1} is never closed"
    return out, "\n".join(prose)


def logical_lines(start: int, lines: list[str]):
    """(line number, text) of each command line of a block: prompts stripped, continuations joined."""
    prompted = any(line.lstrip().startswith("$ ") for line in lines)
    out, pending, first = [], None, 0
    for n, line in enumerate(lines, start=start):
        if pending is None:
            stripped = line.strip()
            if prompted:
                if not stripped.startswith("$ "):
                    continue  # output
                stripped = stripped[2:]
            pending, first = stripped, n
        else:
            pending += " " + line.strip()
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        out.append((first, pending))
        pending = None
    if pending is not None:
        out.append((first, pending))
    return out


def shell_segments(line: str) -> list[str]:
    """The simple commands of a shell line, each cut at its first redirection or comment."""
    line = PLACEHOLDER.sub("PLACEHOLDER", line)
    segments, current, quote, i = [], "", None, 0
    skipping = False  # inside a redirection's target, up to the next operator
    optional = 0  # inside a synopsis's [--flag a|b]: its | is not a pipe
    while i < len(line):
        c = line[i]
        if not quote and c == "[" and (not current or current[-1].isspace()):
            optional += 1
        elif not quote and c == "]" and optional:
            optional -= 1
        if optional and c == "|":
            current += c
            i += 1
            continue
        if quote:
            if not skipping:
                current += c
            if c == quote:
                quote = None
            i += 1
            continue
        if c in "'\"":
            quote = c
            if not skipping:
                current += c
        elif c == "\\" and i + 1 < len(line):
            if not skipping:
                current += line[i:i + 2]
            i += 1
        elif c in "|;&":
            segments.append(current)
            current, skipping = "", False
            while i + 1 < len(line) and line[i + 1] in "|&":
                i += 1
        elif c in "<>":
            if not skipping:
                current = re.sub(r"(?:^|\s)\d$", "", current)  # 2>/dev/null: the descriptor is not an argument
            skipping = True
        elif c == "#" and (not current or current[-1].isspace()):
            break
        elif not skipping:
            current += c
        i += 1
    segments.append(current)
    return [s.strip() for s in segments if s.strip()]


def harness_args(segment: str):
    """The CLI arguments of a simple command that runs the harness, or None."""
    try:
        tokens = shlex.split(segment)
    except ValueError as exc:
        raise AssertionError(f"cannot split {segment!r}: {exc}") from None
    for i, tok in enumerate(tokens):
        if tok.rsplit("/", 1)[-1] == "syncbn-harness":
            return tokens[i + 1:]
        if tok == "-m" and i + 1 < len(tokens) and tokens[i + 1] == "harness":
            return tokens[i + 2:]
    return None


def shown_commands():
    """(page, line number, text, args, inline) of every harness command the pages show."""
    found = []
    for page in PAGES:
        text = page.read_text()
        code, prose = blocks(text)
        for start, lines in code:
            for n, line in logical_lines(start, lines):
                for segment in shell_segments(line):
                    args = harness_args(segment)
                    if args is not None:
                        found.append((page, n, line, args, False))
        for m in INLINE_COMMAND.finditer(prose):
            n = prose.count("\n", 0, m.start()) + 1
            span = " ".join(m.group(1).split())
            for segment in shell_segments(span):
                args = harness_args(segment)
                if args is not None:
                    found.append((page, n, span, args, True))
    return found


# ---------------------------------------------------------------------- parsing with click


@pytest.fixture(scope="module")
def cli():
    from harness.commands import cli as group
    from harness.commands import load_commands

    load_commands()
    return group


def all_params(cmd: click.Command):
    yield from cmd.params
    if isinstance(cmd, click.Group):
        for sub in cmd.commands.values():
            yield from all_params(sub)


@pytest.fixture
def paths_need_not_exist(cli, monkeypatch):
    """Placeholders (``~/pytorch``, ``baseline.json``) stand for files the reader has: do not ask for them."""
    for param in all_params(cli):
        if isinstance(param.type, click.Path):
            monkeypatch.setattr(param.type, "exists", False)


def resolve(cli, args: list[str]):
    """The command ``args`` name and the arguments left for it; a missing command fails with the choices."""
    cmd, rest, path = cli, list(args), ["syncbn-harness"]
    while isinstance(cmd, click.Group) and rest and not rest[0].startswith("-"):
        name = rest.pop(0)
        sub = cmd.get_command(click.Context(cmd, info_name=" ".join(path)), name)
        if sub is None:
            raise AssertionError(f"no command {' '.join(path + [name])!r}: choose one of {sorted(cmd.commands)}")
        cmd, path = sub, path + [name]
    return cmd, rest, " ".join(path)


def option_names(cmd: click.Command) -> set[str]:
    names = {"-h", "--help"}
    for p in cmd.params:
        if isinstance(p, click.Option):
            names |= set(p.opts) | set(p.secondary_opts)
    return names


def check_parses(cli, args: list[str], inline: bool = False) -> None:
    """Fail (AssertionError or click's UsageError) unless click accepts ``args``; run nothing."""
    if any(a.startswith("[-") for a in args):
        # A usage synopsis: the command must exist and every flag it names must be one of its options.
        words = []
        for a in args:
            if a.startswith(("-", "[")):
                break
            words.append(a)
        cmd, _, name = resolve(cli, words)
        flags = {FLAG.match(a.lstrip("[")).group(1) for a in args if FLAG.match(a.lstrip("["))}
        unknown = sorted(flags - option_names(cmd))
        assert not unknown, f"{name}: no such option(s) {unknown}"
        return
    cmd, rest, name = resolve(cli, args)
    if inline and not rest:
        return  # a command named in prose: that it exists is all it claims
    try:
        ctx = cmd.make_context(name, rest)
        ctx.close()
    except click.exceptions.Exit:
        pass  # --help, --version
    # Anything else click raises (an unknown option, a bad choice, a missing or extra argument) fails.


def test_the_pages_show_harness_commands():
    pages = {page for page, *_ in shown_commands()}
    assert README in pages and len(pages) >= 4, sorted(p.name for p in pages)


def test_every_command_shown_parses(cli, paths_need_not_exist):
    failures = []
    for page, n, text, args, inline in shown_commands():
        try:
            check_parses(cli, args, inline)
        except (AssertionError, click.exceptions.ClickException) as exc:
            msg = exc.format_message() if isinstance(exc, click.exceptions.ClickException) else str(exc)
            failures.append(f"{page.relative_to(ROOT)}:{n}: {text}\n    {msg}")
    assert not failures, "commands that do not parse:\n" + "\n".join(failures)


def test_the_parser_check_catches_what_it_should(cli, paths_need_not_exist):
    """The check above is worth something: a wrong flag, command or choice fails; placeholders do not."""
    for args in (["run", "--device", "cpu"], ["diff", "A", "B"], ["bench", "pool", "--cases", "3"],
                 ["bisect", "--overlay", "~/no/such/pytorch", "--good", "G", "--bad", "B"],
                 ["report", "[--store", "results]", "[--out", "reports]"], ["run", "--help"]):
        check_parses(cli, args)
    check_parses(cli, ["promote"], inline=True)
    for args in (["run", "--no-such-flag"], ["run", "--device", "gpu"], ["no-such-command"], ["bench", "nothing"],
                 ["gate"], ["promote"], ["report", "[--nope", "x]"], ["env", "extra"]):
        with pytest.raises((AssertionError, click.exceptions.ClickException)):
            check_parses(cli, args)


def test_shell_lines_are_cut_to_the_harness_command():
    line = ("SYNCBN_DRIFT=0.01 syncbn-harness gate --baseline b.json --case 'a|b' 2>/dev/null "
            "| tail -n 1 > out.txt # comment")
    (segment,) = [s for s in shell_segments(line) if "syncbn-harness" in s]
    assert harness_args(segment) == ["gate", "--baseline", "b.json", "--case", "a|b"]
    assert harness_args("torchrun --nnodes=2 -m harness run --store results/") == ["run", "--store", "results/"]
    assert harness_args(".venv/bin/syncbn-harness run --device cpu") == ["run", "--device", "cpu"]
    assert shell_segments("syncbn-harness build-kernels --cuda-arch <the GPUs' architectures> < in.txt") == \
        ["syncbn-harness build-kernels --cuda-arch PLACEHOLDER"]
    assert shell_segments("syncbn-harness search [--device cpu|cuda] [--budget 5m | --max-cases N] | less") == \
        ["syncbn-harness search [--device cpu|cuda] [--budget 5m | --max-cases N]", "less"]
    assert logical_lines(1, ["$ syncbn-harness run \\", "    --device cpu", "output line"]) == \
        [(1, "syncbn-harness run --device cpu")]


# ---------------------------------------------------------------------- the front page


def test_the_two_commands_are_the_ones_ci_runs():
    text = README.read_text()
    head, sep, rest = text.partition("\n## The two commands\n")
    assert sep, "README has no '## The two commands' section"
    code, _ = blocks(rest)
    assert code, "no code block under '## The two commands'"
    lines = code[0][1]
    commands = [line for line in lines if line.strip() and not line.lstrip().startswith("#")]
    assert commands == [RUN_COMMAND, TEST_COMMAND]
    for command in commands:
        before = lines[lines.index(command) - 1]
        assert before.startswith("# "), f"no comment line above {command!r}"
    ci = (ROOT / ".ci" / "run").read_text()
    assert ".venv/bin/pip install --quiet --no-compile torch==2.13.0 -e '.[test]'" in ci
    assert ".venv/bin/python -m pytest -n 2" in ci


def test_the_first_screen_holds_the_title_and_the_two_commands():
    lines = README.read_text().splitlines()
    assert lines[0].startswith("# syncbn-harness")
    first = lines[:FIRST_SCREEN]
    assert RUN_COMMAND in first and TEST_COMMAND in first


def test_readme_lines_fit_a_terminal():
    wide = []
    for n, line in enumerate(README.read_text().splitlines(), start=1):
        if len(line) <= MAX_WIDTH or line in (RUN_COMMAND, TEST_COMMAND):
            continue
        if URL.search(line) and len(URL.sub("", line)) <= MAX_WIDTH:
            continue
        wide.append(f"README.md:{n}: {len(line)} columns: {line[:60]}...")
    assert not wide, "\n".join(wide)


# ---------------------------------------------------------------------- links


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    _, prose = blocks(page.read_text())
    seen: dict[str, int] = {}
    out = set()
    for line in prose.splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            s = slug(m.group(1))
            out.add(s if s not in seen else f"{s}-{seen[s]}")
            seen[s] = seen.get(s, 0) + 1
    return out


def test_anchors_are_githubs():
    assert slug("torch's non-gloo path on CPU: `--backend nccl-contract`") == \
        "torchs-non-gloo-path-on-cpu---backend-nccl-contract"
    assert slug("torch.compile") == "torchcompile" and slug("2026-11-25") == "2026-11-25"


def test_relative_links_resolve():
    broken = []
    for page in PAGES:
        _, prose = blocks(page.read_text())
        for m in LINK.finditer(prose):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            n = prose.count("\n", 0, m.start()) + 1
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}:{n}: {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}:{n}: {target}: no heading with that anchor")
    assert not broken, "\n".join(broken)


def test_docs_pages_link_back_and_are_linked():
    readme = README.read_text()
    for page in DOCS:
        text = page.read_text()
        assert f"](docs/{page.name})" in readme, f"README.md does not link docs/{page.name}"
        first_paragraph = text.split("\n\n", 2)[1]
        assert "](../README.md)" in first_paragraph, f"docs/{page.name}: its first paragraph does not link the README"
