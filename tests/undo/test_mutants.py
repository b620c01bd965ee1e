"""Mutants of SyncBatchNorm's Python (harness.undo.mutants): pure, over a class written here and torch's own files."""

from __future__ import annotations

import ast
import textwrap

import pytest

from harness.undo import sources
from harness.undo.hunks import canonical
from harness.undo.mutants import OPERATORS, mutants, sites
from harness.undo.sweep import installed_text

SMALL = textwrap.dedent('''
    class Other:
        def f(self, x):
            return x + 1

    class SyncBatchNorm:
        """Docs, not code."""
        def forward(self, x, process_group):
            if x.numel() > 0:
                n = x.numel() // x.size(1)
            x = x.contiguous()
            dist.all_reduce(x, ReduceOp.SUM, process_group)
            return torch.cat([x, x], dim=0) * n
''')


def test_only_syncbatchnorm_is_mutated_and_every_operator_has_its_sites():
    found = sites(SMALL)
    assert all(function == "forward" for function, _, _ in found)
    ops = {op for _, op, _ in found}
    assert ops == {"compare", "arith", "number", "branch", "call", "group", "reduce", "keyword", "statement"}
    assert ("forward", "arith", "x + 1") not in found  # class Other is left alone


def test_each_mutant_is_one_change_that_parses_and_ids_are_unique():
    made = list(mutants("torch/nn/modules/_functions.py", SMALL))
    assert len(made) == len(sites(SMALL)) and len({m.id for m in made}) == len(made)
    original = canonical(SMALL)
    for m in made:
        ast.parse(m.text)
        assert m.text != original, m.id
        assert m.id.startswith("_functions:forward:")
    by_id = {m.id: m.text for m in made}
    assert "x.contiguous()" not in by_id["_functions:forward:call:x.contiguous()"]
    assert "ReduceOp.MAX" in by_id["_functions:forward:reduce:ReduceOp.SUM"]
    assert "dist.all_reduce(x, ReduceOp.SUM, None)" in by_id[
        "_functions:forward:group:dist.all_reduce(x, ReduceOp.SUM, process_group)"]


def test_operators_filter_the_mutants():
    only = list(mutants("torch/nn/modules/_functions.py", SMALL, ("branch",)))
    assert {m.operator for m in only} == {"branch"} and len(only) == 2  # the test forced True, then False


@pytest.mark.parametrize("rel", sources.FILES)
def test_torchs_own_files_give_many_mutants_with_stable_unique_ids(rel):
    text = installed_text(rel)
    made = list(mutants(rel, text))
    assert len(made) > 50
    assert len({m.id for m in made}) == len(made)
    assert [m.id for m in mutants(rel, text)] == [m.id for m in made]  # the same every time
    assert {m.operator for m in made} <= set(OPERATORS)
