"""The catalog: every case of every family, and selection over it.

- :mod:`harness.catalog.case`: what a case is (plain data, no torch);
- :mod:`harness.catalog.dtypes`: the dtypes a case may name and their unit roundoffs (no torch);
- :mod:`harness.catalog.data`: the tensors a case stands for (:func:`~harness.catalog.data.materialize`);
- :mod:`harness.catalog.covering`: the pairwise covering arrays of the default selection;
- :mod:`harness.catalog.found`: the promoted search cases (what ``search --save`` and ``promote`` write);
- the families themselves live in ``cases/`` (the package ``harness.cases``), one module each.

Selection (:func:`select`): ``--case GLOB`` (shell-style, repeatable) picks
the cases of the default selection whose ID matches, or of the full product
with ``--exhaustive``; a pattern without wildcards is an exact ID and selects
that case whether it is in the default selection or not. ``--world-size N``
(repeatable) keeps the cases of those world sizes. A pattern that matches no
case at all is a usage error naming the families; a selection left empty by
``--world-size`` is one naming the world sizes that exist.
"""

from __future__ import annotations

import fnmatch
import importlib
from functools import lru_cache
from typing import Iterable, Optional

from harness.catalog.case import Case
from harness.errors import UsageError

WILDCARDS = set("*?[")


def families() -> dict[str, object]:
    """Family name -> module, in catalog order."""
    from harness import cases as pkg

    out = {}
    for name in pkg.FAMILY_MODULES:
        mod = importlib.import_module(f"harness.cases.{name}")
        out[mod.FAMILY] = mod
    return out


@lru_cache(maxsize=1)
def _all_cases() -> tuple[Case, ...]:
    seen: dict[str, Case] = {}
    for fam, mod in families().items():
        for case in mod.cases():
            if case.id in seen:
                raise ValueError(f"duplicate case id {case.id!r} in family {fam}")
            seen[case.id] = case
    return tuple(seen.values())


def all_cases() -> list[Case]:
    """Every case of every family (the exhaustive product), in catalog order, IDs unique."""
    return list(_all_cases())


def is_exact(pattern: str) -> bool:
    """Whether ``pattern`` is a case ID rather than a glob."""
    return not (set(pattern) & WILDCARDS)


def select(patterns: Iterable[str] = (), *, exhaustive: bool = False,
           world_sizes: Optional[Iterable[int]] = None, scenarios: Optional[Iterable[str]] = None) -> list[Case]:
    """The cases a command runs (see the module docstring for the rule); ``scenarios`` keeps only those."""
    patterns = list(patterns)
    sizes = set(world_sizes or ())
    everything = all_cases()
    wanted_scenarios = set(scenarios or ())
    known_scenarios = sorted({c.scenario for c in everything})
    if wanted_scenarios - set(known_scenarios):
        raise UsageError(f"--scenario {sorted(wanted_scenarios - set(known_scenarios))[0]!r} is no scenario: choose "
                         f"from {', '.join(known_scenarios)}")
    if wanted_scenarios:
        everything = [c for c in everything if c.scenario in wanted_scenarios]
    in_pool = {c.id for c in everything if exhaustive or c.default}
    exact = {p for p in patterns if is_exact(p)}
    globs = [p for p in patterns if not is_exact(p)]
    unknown = [p for p in patterns if not any(fnmatch.fnmatchcase(c.id, p) for c in everything)]
    if unknown:
        raise UsageError(f"--case {unknown[0]!r} matches no case: IDs start with one of "
                         f"{', '.join(families())} (see `syncbn-harness list cases --exhaustive`)")

    def wanted(case: Case) -> bool:
        if case.id in exact:
            return True
        return case.id in in_pool and (not patterns or any(fnmatch.fnmatchcase(case.id, p) for p in globs))

    base = [c for c in everything if wanted(c)]
    chosen = [c for c in base if not sizes or c.world_size in sizes]
    if not base:
        raise UsageError(f"--case {globs[0]!r} matches only cases outside the default selection: add "
                         "--exhaustive to select from the full product")
    if not chosen:
        have = ", ".join(map(str, sorted({c.world_size for c in base})))
        raise UsageError(f"--world-size {', '.join(map(str, sorted(sizes)))} leaves no case: the selected cases "
                         f"have world sizes {have}")
    return chosen
