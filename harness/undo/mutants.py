"""Mutants of SyncBatchNorm's Python: one small change each to the installed file, for the mutation sweep.

A regression harness should fail on any change to SyncBatchNorm's Python
that changes what it computes. :func:`mutants` makes, from the installed
``_functions.py`` and ``batchnorm.py`` (the code of their ``SyncBatchNorm``
classes only), one variant per site and operator of :data:`OPERATORS`:

- ``arith``: ``+`` <-> ``-``, ``*`` <-> ``/``, ``//`` -> ``/``;
- ``compare``: ``==`` <-> ``!=``, ``<`` <-> ``<=``, ``>`` <-> ``>=``, ``is`` <-> ``is not``;
- ``logic``: ``and`` <-> ``or``; ``not x`` -> ``x``;
- ``branch``: an ``if``'s test -> ``True`` and -> ``False`` (two mutants);
- ``call``: a call of ``.contiguous()``, ``.to(...)``, ``.float()``, ``.view(...)``,
  ``.reshape(...)``, ``.squeeze(...)``, ``.clone()`` dropped (its receiver in its place);
- ``number``: an integer constant ``n`` -> ``n + 1`` (dims, sizes, counts);
- ``keyword``: a ``dtype=``, ``device=``, ``dim=``, ``group=``, ``async_op=``
  keyword argument dropped;
- ``group``: the name ``process_group`` given to a call -> ``None`` (the default group);
- ``reduce``: ``ReduceOp.SUM`` -> ``ReduceOp.MAX``;
- ``statement``: a statement that is a bare call (an in-place update, a
  collective's wait) dropped.

A mutant's ID is stable across builds as long as the code it mutates is:
``<file stem>:<function>:<operator>:<the site's code>`` (``#2`` for the
second identical site). Texts are in canonical form
(:func:`harness.undo.hunks.canonical`), as the sweep's control.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Iterator, Optional

from harness.undo.hunks import canonical

OPERATORS = ("arith", "compare", "logic", "branch", "call", "number", "keyword", "group", "reduce", "statement")
ARITH = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div}
COMPARE = {ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE,
           ast.GtE: ast.Gt, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
DROPPED_CALLS = ("contiguous", "to", "float", "view", "reshape", "squeeze", "clone")
DROPPED_KEYWORDS = ("dtype", "device", "dim", "group", "async_op")
SNIPPET = 70


@dataclass(frozen=True)
class Mutant:
    """One mutant: its stable ``id``, the file it changes (``rel``) and that file's mutated canonical text."""

    id: str
    rel: str
    operator: str
    text: str


class _Sites(ast.NodeTransformer):
    """Walks the ``SyncBatchNorm`` classes; at the ``target``-th site (counting every operator's sites in walk
    order) applies that mutation. ``found`` lists every site as (function, operator, snippet)."""

    def __init__(self, target: int = -1):
        self.target, self.count, self.found = target, 0, []
        self.function: Optional[str] = None
        self.inside = False

    def _site(self, operator: str, node: ast.AST) -> bool:
        if not self.inside:
            return False
        self.found.append((self.function or "<class>", operator, ast.unparse(node).replace("\n", " ")))
        hit = self.count == self.target
        self.count += 1
        return hit

    def visit_ClassDef(self, node):
        if node.name != "SyncBatchNorm":
            return node
        self.inside = True
        self.generic_visit(node)
        self.inside = False
        return node

    def visit_FunctionDef(self, node):
        outer, self.function = self.function, node.name if self.function is None else f"{self.function}.{node.name}"
        self.generic_visit(node)
        self.function = outer
        return node

    def visit_BinOp(self, node):
        self.generic_visit(node)
        if type(node.op) in ARITH and self._site("arith", node):
            node.op = ARITH[type(node.op)]()
        return node

    def visit_Compare(self, node):
        self.generic_visit(node)
        if len(node.ops) == 1 and type(node.ops[0]) in COMPARE and self._site("compare", node):
            node.ops = [COMPARE[type(node.ops[0])]()]
        return node

    def visit_BoolOp(self, node):
        self.generic_visit(node)
        if self._site("logic", node):
            node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        return node

    def visit_UnaryOp(self, node):
        self.generic_visit(node)
        if isinstance(node.op, ast.Not) and self._site("logic", node):
            return node.operand
        return node

    def visit_If(self, node):
        self.generic_visit(node)
        for value in (True, False):
            if self._site("branch", node.test):
                node.test = ast.copy_location(ast.Constant(value), node.test)
        return node

    def visit_Call(self, node):
        self.generic_visit(node)
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in DROPPED_CALLS and self._site("call", node):
            return func.value
        for kw in list(node.keywords):
            if kw.arg in DROPPED_KEYWORDS and self._site("keyword", kw):
                node.keywords.remove(kw)
        for i, arg in enumerate(node.args):
            if isinstance(arg, ast.Name) and arg.id == "process_group" and self._site("group", node):
                node.args[i] = ast.copy_location(ast.Constant(None), arg)
        for kw in node.keywords:
            if isinstance(kw.value, ast.Name) and kw.value.id == "process_group" and self._site("group", node):
                kw.value = ast.copy_location(ast.Constant(None), kw.value)
        return node

    def visit_Attribute(self, node):
        self.generic_visit(node)
        if node.attr == "SUM" and self._site("reduce", node):
            node.attr = "MAX"
        return node

    def visit_Constant(self, node):
        if type(node.value) is int and self._site("number", node):
            return ast.copy_location(ast.Constant(node.value + 1), node)
        return node

    def visit_Expr(self, node):
        self.generic_visit(node)
        if isinstance(node.value, ast.Call) and self._site("statement", node):
            return ast.copy_location(ast.Pass(), node)
        return node


def sites(text: str) -> list[tuple[str, str, str]]:
    """Every mutation site of ``text``'s ``SyncBatchNorm`` class: (function, operator, the site's code)."""
    walker = _Sites()
    walker.visit(ast.parse(canonical(text)))
    return walker.found


def mutants(rel: str, text: str, operators: tuple[str, ...] = OPERATORS) -> Iterator[Mutant]:
    """One :class:`Mutant` of ``text`` (the file at ``rel``) per site whose operator is in ``operators``."""
    tree = ast.parse(canonical(text))
    stem = PurePosixPath(rel).stem
    seen: dict[str, int] = {}
    for k, (function, operator, snippet) in enumerate(sites(text)):
        base = f"{stem}:{function}:{operator}:{snippet[:SNIPPET]}"
        seen[base] = seen.get(base, 0) + 1
        if operator not in operators:
            continue
        walker = _Sites(target=k)
        mutated = ast.fix_missing_locations(walker.visit(copy.deepcopy(tree)))
        ident = base if seen[base] == 1 else f"{base}#{seen[base]}"
        yield Mutant(ident, rel, operator, ast.unparse(mutated) + "\n")
