"""A short repro's ``data()`` is the case's data: the same draws from the same seed, bit for bit.

The file redraws the case's tensors with plain torch calls; the harness judged the implementation on
:func:`~harness.catalog.data.materialize`'s. Both must agree for the catalog's cases (standard normals drawn
in float64, in sequence) and for search's (drawn in float32, each rank's by a generator of its own, or in
sequence), with hostile inputs (an offset, a scale, a constant
channel) and batch sizes that change between steps.
"""

from __future__ import annotations

import pytest
import torch

from harness import catalog
from harness.catalog.data import materialize
from harness.repro.short import Target, source
from harness.repro.symptom import Symptom
from harness.judge.status import Status
from harness.search import space

SEARCH_HOSTILE = space.make_case(batch_sizes=(3, 0), spatial=((2, 5), (2, 5)), channels=3, dtype="float16",
                                 steps=("train", "eval", "train"), step_batch_sizes=((3, 0), (1, 2), (2, 2)),
                                 input_mean=1000.0, input_scale=0.5, constant_channels=(1,), seed=77)


@pytest.mark.parametrize("case", [
    catalog.select(["allgather-shape/uneven-2-6/float16-float32/channels_last/ws2"])[0],
    catalog.select(["numerics/offset-1e3/ws2"])[0],
    space.make_case(batch_sizes=(2, 5), spatial=((3,), (3,)), channels=4, seed=5),
    SEARCH_HOSTILE,
    space.make_case(batch_sizes=(2, 5), spatial=((3,), (3,)), channels=4, seed=5, draws="sequential"),
    space.without_rank(space.make_case(batch_sizes=(1, 2, 3), spatial=((3,),) * 3, channels=2, seed=6), 0),
], ids=["catalog", "catalog-hostile", "search", "search-hostile", "search-sequential", "search-rank-removed"])
def test_the_short_files_data_is_the_cases_data(case):
    text = source(case, Target("torch", "torch", "from torch.nn import SyncBatchNorm", on_cuda=False),
                  Symptom(Status.ERROR, exception_type="RuntimeError"), seen="test")
    assert ("the samples' drawn in float32" in text) == (case.normals == "float32")
    assert ("each rank's by a generator of its own." in text) == (case.draws == "per-rank")
    assert ("drawn in float64 from SEED." in text) == (case.normals == "float64")
    module: dict = {"__name__": "short_repro"}
    exec(compile(text, "repro.py", "exec"), module)
    params, steps = module["data"]()
    want = materialize(case)
    for name in ("weight", "bias", "running_mean", "running_var"):
        assert torch.equal(params[name], getattr(want, name)), name
    assert len(steps) == len(case.steps)
    for s, row in enumerate(steps):
        for r, (x, dy) in enumerate(row):
            assert torch.equal(x, want.inputs[s][r].double()), (s, r)
            assert torch.equal(dy, want.grad_outputs[s][r].double()), (s, r)


def test_search_draws_float32_normals_and_the_catalog_float64():
    assert SEARCH_HOSTILE.normals == "float32"
    assert {c.normals for c in catalog.all_cases() if c.family != "search"} == {"float64"}
    # The same parameters with float64 normals are another case, with another ID and other data.
    fields = space.parameters(SEARCH_HOSTILE)
    old = space.make_case(**{**fields, "normals": "float64"})
    assert old.id != SEARCH_HOSTILE.id and space.make_case(**fields) == SEARCH_HOSTILE
    assert not torch.equal(materialize(old).grad_outputs[0][0], materialize(SEARCH_HOSTILE).grad_outputs[0][0])
