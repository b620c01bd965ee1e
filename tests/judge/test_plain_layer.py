"""What nn.BatchNorm refuses (probed on CPU): an error the layer raises too is unsupported, in a real run."""

from __future__ import annotations

from dataclasses import replace

import pytest

from harness import catalog
from harness.judge.plain_layer import refusal, refusal_on_cuda
from harness.judge.status import Status

BASE = next(c for c in catalog.all_cases() if c.id == "mixed-precision/uneven/float32-float64/ws2")
EVAL = replace(BASE, id="mixed-precision/uneven/float32-float64/eval/ws2", steps=("eval",))
LAYER_SAYS = "mixed dtype (CPU): expect parameter to have scalar type of Float"


def test_the_probe_gives_what_this_torch_raises_and_nothing_where_it_accepts():
    said = refusal(EVAL, "cpu")
    assert (said.said, said.device, said.dtype, said.param_dtype) == (f"RuntimeError: {LAYER_SAYS}", "cpu",
                                                                     "float32", "float64")
    assert refusal(replace(EVAL, param_dtype="float32"), "cpu") is None
    assert refusal(EVAL, "cuda") is None  # never probed on CUDA: refusal_on_cuda is asked before a case runs
    assert refusal(replace(EVAL, scenario="model"), "cpu") is None  # a model's other layers refuse for themselves


@pytest.mark.parametrize("dtype, param_dtype, affine, ndim, says", [
    ("float32", "float64", True, 4, "cuDNN path requires input and weight of one dtype"),
    ("float16", "float32", True, 4, None),  # cuDNN takes half input with float parameters
    ("bfloat16", "float64", True, 4, "reads a float64 weight as Float"),
    ("float64", "float32", True, 2, "reads a float32 weight as Double"),
    ("float64", "float32", False, 4, None),  # no weight to read
    ("float16", "float16", True, 4, None),
])
def test_the_cuda_model_names_the_path_that_refuses(dtype, param_dtype, affine, ndim, says):
    said = refusal_on_cuda(dtype, param_dtype, affine, ndim)
    assert (said is None) if says is None else (says in said), said


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
