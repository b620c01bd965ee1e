"""``covering.product``: the full product with the pairwise rows marked, and the families' selections it makes.

The families that mark their default selection with it are pinned here, case by case: the IDs and whether each
is in the default selection, as a digest per family. Stored records and baselines are keyed by these IDs, and a
default selection that moves silently changes what ``run`` and ``gate`` compare. A deliberate change of a
family's factors updates its line (the assertion prints the new one).
"""

from __future__ import annotations

import hashlib
import itertools

import pytest

from harness import catalog
from harness.catalog import covering

# family -> (cases, of them in the default selection, sha256 of "<id> <default>\n" lines, first 16 digits)
PINNED = {
    "training-loop": (132, 44, "cda2b23606dbf458"),
    "ddp": (152, 19, "ea6be7ba9b0a0896"),
    "validation": (16, 6, "129485ac829b1fe4"),
    "activation-checkpoint": (32, 8, "c8fddb5ae4da5cf5"),
    "double-backward": (16, 6, "1a393b5f63afe789"),
    "autocast": (19, 8, "a24609c15baa4ffa"),
    "conversion": (74, 37, "35eafbd95cb81421"),
    "fsdp": (12, 2, "e4f54ec054c745ea"),
    "private-ops": (19, 19, "f064a7d784cddbfa"),
}


def test_every_row_of_the_product_comes_once_in_order_and_the_default_rows_cover_every_pair():
    factors = (("a", "b", "c"), ({"x": 1}, {"x": 2}), (None, 0, 0.0), ("p", "q"))  # unhashable and equal values
    rows = list(covering.product(*factors))
    assert [values for values, _ in rows] == list(itertools.product(*factors))
    positions = [range(len(f)) for f in factors]
    default = [row for (_, in_default), row in zip(rows, itertools.product(*positions)) if in_default]
    assert covering.covers_all_pairs(default, positions)
    assert default == covering.pairwise(positions) and len(default) < len(rows)


@pytest.mark.parametrize("family", sorted(PINNED))
def test_the_families_built_with_it_keep_their_cases_and_default_selection(family):
    cases = [c for c in catalog.all_cases() if c.family == family]
    text = "".join(f"{c.id} {c.default}\n" for c in cases)
    found = (len(cases), sum(c.default for c in cases), hashlib.sha256(text.encode()).hexdigest()[:16])
    assert found == PINNED[family], f'"{family}": {found},'
