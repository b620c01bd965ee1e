"""The search's case space, without processes: every drawn case is a valid Case within the space's bounds, its
ID stable and naming what known issues match on (dtypes, split, settings), its steps well defined for every group.

Signatures are tested in test_signature.py, promotion in test_promote.py, the budget flag in test_budget.py.
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings

from harness.catalog.case import STEP_KINDS, Case
from harness.search import space


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(space.strategy())
def test_every_drawn_case_is_valid_bounded_and_named_for_what_it_is(case: Case):
    assert case.family == "search" and case.id.startswith("search/")
    assert case.world_size in space.WORLD_SIZES
    assert not case.default
    sizes = [case.sizes_at(s) for s in range(len(case.steps))]
    per_rank = max(b * math.prod(sp) for row in sizes for b, sp in zip(row, case.spatial))
    assert per_rank * case.channels <= space.MAX_ELEMENTS
    groups = case.groups or (tuple(range(case.world_size)),)
    for kind, row in zip(case.steps, sizes):
        if STEP_KINDS[kind] == "train":
            for g in groups:
                assert sum(row[r] * math.prod(case.spatial[r]) for r in g) >= 2
    assert f"/{case.dtype}-{case.param_dtype}/" in case.id
    assert f"/{space.split_label(case.batch_sizes)}/" in case.id
    assert ("momentum-none" in case.id) == (case.momentum is None)
    assert ("no-running-stats" in case.id) == (not case.track_running_stats)
    # The same parameters give the same ID; any other parameter another.
    again = space.make_case(**{k: v for k, v in case.to_dict().items() if k not in ("id", "family", "default", "note")
                               and k not in ("scenario", "model", "optimizer", "ddp", "checkpoint", "compile")})
    assert again.id == case.id
    assert Case.from_dict(case.to_dict()) == case


def test_ids_differ_when_any_parameter_does():
    base = dict(batch_sizes=(2, 3), spatial=((4,), (4,)), channels=3, seed=5)
    a = space.make_case(**base)
    assert space.make_case(**base).id == a.id
    assert space.make_case(**{**base, "seed": 6}).id != a.id
    assert space.make_case(**{**base, "eps": 1e-3}).id != a.id
    assert a.id == "search/float32-float32/contiguous/uneven-2-3/c3x4/plain/train/ws2-" + a.id.rsplit("-", 1)[1]
