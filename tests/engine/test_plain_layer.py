"""An error that nn.BatchNorm raises too is unsupported: scripted rank outcomes, then torch's own layer run."""

from __future__ import annotations

from dataclasses import replace

import pytest

from harness import catalog
from harness.engine.plain_layer import refusal, refused_like_the_layer
from harness.results.records import RankOutcome, RankStatus, Status

BASE = next(c for c in catalog.all_cases() if c.id == "mixed-precision/uneven/float32-float64/ws2")
EVAL = replace(BASE, id="mixed-precision/uneven/float32-float64/eval/ws2", steps=("eval",))
LAYER_SAYS = "mixed dtype (CPU): expect parameter to have scalar type of Float"


def _raised(rank: int, message: str = LAYER_SAYS, kind: str = "RuntimeError") -> RankOutcome:
    return RankOutcome(rank=rank, status=RankStatus.ERROR, exception_type=kind, message=message)


def test_the_probe_gives_what_this_torch_raises_and_nothing_where_it_accepts():
    assert refusal(EVAL, "cpu") == f"RuntimeError: {LAYER_SAYS}"
    assert refusal(replace(EVAL, param_dtype="float32"), "cpu") is None
    assert refusal(EVAL, "cuda") is None  # CUDA's refusals are the CUDA contract's, before a case runs


@pytest.mark.parametrize("ranks, refused", [
    ([_raised(0), _raised(1)], True),
    ([_raised(0), RankOutcome(rank=1, status=RankStatus.PASS)], True),
    ([_raised(0), _raised(1, "another message")], False),
    ([_raised(0, kind="ValueError")], False),
    ([RankOutcome(rank=0, status=RankStatus.MISMATCH)], False),
])
def test_every_rank_that_raised_must_have_raised_exactly_the_layers_error(ranks, refused):
    assert bool(refused_like_the_layer(EVAL, "cpu", ranks)) is refused


@pytest.mark.slow
def test_torch_refusing_what_batchnorm_refuses_is_unsupported_and_an_accepting_layer_still_runs():
    from harness.engine.plan import execute, make_plan
    from harness.selection import Selection

    records, _ = execute(make_plan(Selection(impls=("torch", "reference"), device="cpu"), diagnose=False,
                                   cases=[EVAL]))
    by_impl = {r.impl: r for r in records}
    assert by_impl["torch"].status is Status.UNSUPPORTED, by_impl["torch"].message
    assert "nn.BatchNorm on cpu refuses float32 input with float64 parameters too" in by_impl["torch"].message
    assert by_impl["reference"].status is Status.PASS, by_impl["reference"].message
