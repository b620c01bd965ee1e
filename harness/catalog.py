"""The catalog: every case of every family, and selection over it.

Selection (SPEC §11): ``--case GLOB`` (shell-style, repeatable) over IDs, the
default selection unless ``--exhaustive``, ``--world-size N`` (repeatable).
An unknown pattern is a usage error that lists the families.
"""

from __future__ import annotations

import fnmatch
import importlib
from typing import Iterable, Optional

from harness.case import Case
from harness.errors import UsageError


def families() -> dict[str, object]:
    """Family name -> module, in catalog order."""
    from harness import cases as pkg

    out = {}
    for name in pkg.FAMILY_MODULES:
        mod = importlib.import_module(f"harness.cases.{name}")
        out[mod.FAMILY] = mod
    return out


def all_cases() -> list[Case]:
    """Every case of every family (the exhaustive product), in catalog order, IDs unique."""
    seen: dict[str, Case] = {}
    for fam, mod in families().items():
        for case in mod.cases():
            if case.id in seen:
                raise ValueError(f"duplicate case id {case.id!r} in family {fam}")
            seen[case.id] = case
    return list(seen.values())


def select(patterns: Iterable[str] = (), *, exhaustive: bool = False,
           world_sizes: Optional[Iterable[int]] = None) -> list[Case]:
    """The cases a command runs: matching any pattern (or the default selection)."""
    patterns = list(patterns)
    world_sizes = set(world_sizes or ())
    pool = all_cases()
    if not patterns and not exhaustive:
        pool = [c for c in pool if c.default]
    chosen = []
    for case in pool:
        if patterns and not any(fnmatch.fnmatchcase(case.id, p) for p in patterns):
            continue
        if world_sizes and case.world_size not in world_sizes:
            continue
        chosen.append(case)
    if patterns:
        unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(c.id, p) for c in pool)]
        if unmatched:
            raise UsageError(
                f"--case {unmatched[0]!r} matches no case: IDs start with one of "
                f"{', '.join(families())} (see `syncbn-harness list cases`)")
    return chosen
