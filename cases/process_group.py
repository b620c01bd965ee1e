"""process-group: SyncBN over process subgroups.

Catches: an ignored ``process_group`` argument (statistics synchronized over
the whole world instead of the subgroup), world size taken from the default
group, ranks of different groups mixing their statistics.
"""

from harness.case import Case

FAMILY = "process-group"


def cases() -> list[Case]:
    return [
        Case(id=f"{FAMILY}/pairs-01-23/ws4", family=FAMILY, batch_sizes=(2, 3, 4, 1),
             spatial=((3, 3),) * 4, groups=((0, 1), (2, 3)), input_scale=1.0),
        Case(id=f"{FAMILY}/split-0-12/ws3", family=FAMILY, batch_sizes=(4, 2, 3),
             spatial=((3, 2),) * 3, groups=((0,), (1, 2))),
    ]
