"""Covering arrays: a small set of rows in which every pair of factor values appears.

The default case selection is a pairwise (strength 2) covering subset of the
generated matrix: any defect triggered by a combination of two factors (say
float16 with an empty rank, or channels_last with world size 3) is met by some
row, at a fraction of the full product's size. The construction is the
greedy one of AETG/IPOG style, made deterministic: rows are picked from the
full product in order, each the one covering the most uncovered pairs (ties
to the earliest), so the same factors always give the same rows. A family
writes its cases as :func:`product` of its factors: every row of the full
product, each marked whether it is in the default selection.
"""

from __future__ import annotations

import itertools
from typing import Iterator, Sequence


def pairwise(factors: Sequence[Sequence]) -> list[tuple]:
    """Rows of the full product such that every pair of values of two factors appears in some row."""
    if len(factors) < 2:
        return [tuple(r) for r in itertools.product(*factors)]
    product = list(itertools.product(*factors))
    k = len(factors)

    def pairs(row):
        return {(i, row[i], j, row[j]) for i in range(k) for j in range(i + 1, k)}

    uncovered = set().union(*(pairs(r) for r in product))
    chosen: list[tuple] = []
    while uncovered:
        best = max(product, key=lambda r: len(pairs(r) & uncovered))
        chosen.append(best)
        uncovered -= pairs(best)
    return sorted(chosen, key=product.index)


def product(*factors: Sequence) -> Iterator[tuple[tuple, bool]]:
    """``(values, in_default)`` for every row of the full product of ``factors``, in ``itertools.product``'s
    order: the row's values, and whether it is one of the :func:`pairwise` rows (the default selection).

    The covering is computed over the values' positions, so values need not be hashable or distinct (a
    factor may hold dicts, or two settings that compare equal).
    """
    positions = [range(len(f)) for f in factors]
    covering = set(pairwise(positions))
    for row in itertools.product(*positions):
        yield tuple(f[i] for f, i in zip(factors, row)), row in covering


def covering_levels(rows: Sequence[tuple]) -> list[tuple]:
    """A subset of ``rows`` in which every value each factor takes in ``rows`` appears at least once.

    Used to add a new factor level (a second backend, say) to an existing pairwise set without changing
    it: the twins chosen here pair the new level with every value of every other factor, which is what
    pairwise coverage asks of it. Greedy like ``pairwise`` (most new values first, ties to the earliest).
    """
    rows = list(rows)
    if not rows:
        return []
    uncovered = {(i, v) for r in rows for i, v in enumerate(r)}
    chosen: list[tuple] = []
    while uncovered:
        best = max(rows, key=lambda r: len(set(enumerate(r)) & uncovered))
        chosen.append(best)
        uncovered -= set(enumerate(best))
    return sorted(chosen, key=rows.index)


def covers_all_pairs(rows: Sequence[tuple], factors: Sequence[Sequence]) -> bool:
    """Whether ``rows`` contain every pair of values of every two factors."""
    k = len(factors)
    for i, j in itertools.combinations(range(k), 2):
        need = set(itertools.product(factors[i], factors[j]))
        have = {(r[i], r[j]) for r in rows}
        if not need <= have:
            return False
    return True
