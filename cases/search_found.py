"""search: cases that ``syncbn-harness search`` found failing and ``search --save`` promoted.

Catches: whatever a search found, as the minimal case it shrank the failure
to, so that the defect stays a regression test once fixed (the kind of
combination a covering array misses: an empty rank with half input and a
subgroup, as in the crash of the empty-input branch of pytorch#74944). The cases are
data (``search_found.json`` beside this module, see
:mod:`harness.catalog.found`); their IDs are the search's own
(``search/<dtypes>/<format>/<split>/<settings>/<steps>/ws<n>-<digest>``) and
every one is in the default selection.
"""

from harness.catalog.case import Case

FAMILY = "search"


def cases() -> list[Case]:
    from harness.catalog.found import promoted_cases

    return promoted_cases()
