"""One upstream change undone on the installed file: the change's hunks of a release diff, merged in reverse.

An upstream change to SyncBatchNorm's Python shows as hunks of the diff
between the file of the release before it (``before``) and the first release
that has it (``after``). A pair of releases often holds several changes, so
the change's own hunks are picked by markers: short fragments that occur in the
lines the change added (:func:`pick`). Undoing it on the installed build is a
three-way merge (:func:`undo`), done by ``git merge-file``: the installed file
is "ours", ``after`` the common base, and ``after`` with only the picked hunks
turned back into ``before``'s lines is "theirs". Where the installed file still
has the changed lines as ``after`` had them, the merge takes theirs there and
keeps every later change elsewhere; where a later change rewrote them, the
merge conflicts and the change cannot be undone on this build as such
(:class:`Undone` says so, with the conflicting region's size).

Nothing of torch's text is stored: the two release files are read at run time
(:mod:`harness.undo.sources`) and the markers are a few tokens each.
"""

from __future__ import annotations

import ast
import difflib
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from harness.errors import HarnessError

MERGE_TIMEOUT_S = 60


@dataclass(frozen=True)
class Hunk:
    """Lines ``before[b0:b1]`` of the older file became ``after[a0:a1]`` of the newer one."""

    b0: int
    b1: int
    a0: int
    a1: int

    def added(self, after: Sequence[str]) -> str:
        return "".join(after[self.a0:self.a1])

    def removed(self, before: Sequence[str]) -> str:
        return "".join(before[self.b0:self.b1])


@dataclass(frozen=True)
class Undone:
    """The installed file with a change undone (``text``), or why it could not be (``reason``)."""

    text: Optional[str]
    hunks: int
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.text is not None


def hunks(before: str, after: str) -> list[Hunk]:
    """The line hunks turning ``before`` into ``after`` (difflib's opcodes that are not equal)."""
    b, a = before.splitlines(keepends=True), after.splitlines(keepends=True)
    matcher = difflib.SequenceMatcher(None, b, a, autojunk=False)
    return [Hunk(i1, i2, j1, j2) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"]


def pick(before: str, after: str, markers: Sequence[str]) -> list[Hunk]:
    """The hunks whose added lines (or, for a pure deletion, removed lines) contain any of ``markers``."""
    b, a = before.splitlines(keepends=True), after.splitlines(keepends=True)
    chosen = []
    for h in hunks(before, after):
        text = h.added(a) if h.a1 > h.a0 else h.removed(b)
        if any(m in text for m in markers):
            chosen.append(h)
    return chosen


def reverted(before: str, after: str, chosen: Sequence[Hunk]) -> str:
    """``after`` with the ``chosen`` hunks turned back into ``before``'s lines, every other hunk kept."""
    b, a = before.splitlines(keepends=True), after.splitlines(keepends=True)
    out, at = [], 0
    for h in sorted(chosen, key=lambda h: h.a0):
        out += a[at:h.a0] + b[h.b0:h.b1]
        at = h.a1
    return "".join(out + a[at:])


def merge(ours: str, base: str, theirs: str) -> tuple[str, int]:
    """``git merge-file`` of three texts: the merged text and its number of conflicts (0: clean)."""
    with tempfile.TemporaryDirectory(prefix="syncbn-undo-") as tmp:
        paths = []
        for name, text in (("ours", ours), ("base", base), ("theirs", theirs)):
            path = Path(tmp) / name
            path.write_text(text)
            paths.append(str(path))
        try:
            out = subprocess.run(["git", "merge-file", "-p", *paths], capture_output=True, text=True,
                                 timeout=MERGE_TIMEOUT_S)
        except FileNotFoundError:
            raise HarnessError("undoing a change needs git on PATH (git merge-file); install git") from None
    if out.returncode < 0 or out.returncode > 127:
        raise HarnessError(f"git merge-file failed ({out.returncode}): {out.stderr.strip()}")
    return out.stdout, out.returncode


def canonical(text: str) -> str:
    """``text`` as ``ast.unparse`` writes it, without docstrings: one statement per line, no comments, one
    quoting style, so that a later release's reformatting (black, ruff) or documentation is no difference."""
    tree = ast.parse(text)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree) + "\n"


def _find(lines: Sequence[str], block: Sequence[str]) -> list[int]:
    """Where ``block`` occurs in ``lines`` as consecutive lines."""
    n = len(block)
    return [i for i in range(len(lines) - n + 1) if list(lines[i:i + n]) == list(block)]


def scopes(text: str) -> list[str]:
    """Each line's innermost enclosing class or function in ``text`` (Python source), as a dotted name
    (``SyncBatchNorm.forward``; ``""`` at module level)."""
    names = [""] * (len(text.splitlines()) + 1)

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}.{child.name}" if prefix else child.name
                names[child.lineno - 1:child.end_lineno] = [name] * (child.end_lineno - child.lineno + 1)
                visit(child, name)
            else:
                visit(child, prefix)

    visit(ast.parse(text), "")
    return names


def _locate(lines: Sequence[str], after: Sequence[str], h: Hunk, in_lines: Sequence[str],
            in_after: Sequence[str]) -> tuple[Optional[int], str]:
    """Where hunk ``h``'s lines of ``after`` are in ``lines``: the index of its first line (for a pure deletion,
    of the line after which the deleted lines go back), widened by ``after``'s lines before it until the place
    is unique within the function (or class) the hunk is in (``in_after``, ``in_lines``: each line's
    :func:`scopes`: the same lines in another method are another place), or else within functions of its name
    (a method moved to a base class); or None and why."""
    anchored = h.a1 == h.a0
    start, end = (h.a0 - 1, h.a0) if anchored else (h.a0, h.a1)
    first = max(start, 0)  # the hunk's own first line (or its anchor), whose scope the place must have
    scope = in_after[first]
    while True:
        block = after[max(start, 0):end]
        found = [(i, in_lines[i + first - max(start, 0)]) for i in _find(lines, block)] if block else []
        # In the same class and function; else in a function of the same name (a method moved to a base class).
        where = [i for i, there in found if there == scope] or [
            i for i, there in found if there.rsplit(".", 1)[-1] == scope.rsplit(".", 1)[-1]]
        if len(where) == 1:
            return where[0] + (h.a0 - max(start, 0)), ""
        if not where or start <= 0:
            first = (after[h.a0] if h.a1 > h.a0 else block[-1] if block else "").strip()
            state = "no longer in" if not where else f"{len(where)} times in"
            return None, f"a later change rewrote it: the line {first!r} is {state} the installed file"
        start -= 1


def undo(installed: str, before: str, after: str, markers: Sequence[str]) -> Undone:
    """The installed file with the change that ``markers`` pick in ``before`` -> ``after`` undone.

    The markers pick the change's hunks of the two release files as shipped; ``after`` with only those hunks
    reverted is the release without the change. What that does to the code is the difference of the two in
    :func:`canonical` form (a change of comments, docstrings or formatting alone does nothing); each of its
    hunks' lines must then be found in the installed file's canonical text (widened by the lines before it
    until unique) and are replaced by the release's lines without the change. A hunk whose lines a later release
    changed is reported, not guessed at."""
    chosen = pick(before, after, markers)
    if not chosen:
        return Undone(None, 0, f"no hunk of the diff holds any of the markers {list(markers)}")
    try:
        without, with_it = canonical(reverted(before, after, chosen)), canonical(after)
    except SyntaxError as exc:
        return Undone(None, len(chosen), f"the release without only this change's hunks does not parse "
                                         f"(line {exc.lineno}: {exc.msg}): its hunks interleave with another "
                                         f"change's")
    b, a = without.splitlines(keepends=True), with_it.splitlines(keepends=True)
    effect = hunks(with_it, without)
    if not effect:
        return Undone(None, len(chosen), "it changed only comments, docstrings or formatting: no code to undo")
    installed_text = canonical(installed)
    lines = installed_text.splitlines(keepends=True)
    in_lines, in_after = scopes(installed_text), scopes(with_it)
    edits = []
    for h in hunks(without, with_it):
        at, why = _locate(lines, a, h, in_lines, in_after)
        if at is None:
            return Undone(None, len(chosen), why)
        edits.append((at, at + (h.a1 - h.a0), b[h.b0:h.b1]))
    for start, end, new in sorted(edits, reverse=True):
        lines[start:end] = new
    text = "".join(lines)
    if text == canonical(installed):
        return Undone(None, len(chosen), "undoing it changes nothing in the installed file")
    return Undone(text, len(chosen))
