"""Covering arrays: a small set of rows in which every pair of factor values appears.

The default case selection is a pairwise (strength 2) covering subset of the
generated matrix: any defect triggered by a combination of two factors (say
float16 with an empty rank, or channels_last with world size 3) is met by some
row, at a fraction of the full product's size. The construction is the
greedy one of AETG/IPOG style, made deterministic: rows are picked from the
full product in order, each the one covering the most uncovered pairs (ties
to the earliest), so the same factors always give the same rows.
"""

from __future__ import annotations

import itertools
from typing import Sequence


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
