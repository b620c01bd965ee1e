"""The CUDA contract of the five SyncBN ops: the table itself, the emulation's conformance to it, the adapter's use.

Design: :func:`calls` builds every dtype combination (float16, bfloat16, float32, float64) of each op's tensor
arguments, over the layouts that pick different CUDA code (contiguous, channels_last, channels_last_3d), with tiny
tensors. :func:`observed` calls ``torch.ops.aten.<op>`` on them and records what happened; :func:`expected` asks
:mod:`harness.impls.cuda_contract`. On CPU the calls go to the emulated kernels, registered by
``torch_emulation.install()`` in a process of its own (it registers into ``aten`` for the whole process); on a GPU
(``cuda`` marker) to torch's real kernels, which checks the table against CUDA itself. The hand-written cases below
come from reading the CUDA sources and do not go through the model's code paths.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest
import torch

from harness import catalog
from harness.impls import cuda_contract, cuda_plan
from harness.judge import plain_layer
from harness.impls.torch_native import TorchImpl

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
OPTIONAL = (None,) + FLOATS
C, W = 3, 2
LAYOUTS = {"contiguous": ((2, C, 2, 2), torch.contiguous_format), "channels_last": ((2, C, 2, 2), torch.channels_last),
           "channels_last_3d": ((2, C, 2, 1, 2), torch.channels_last_3d)}


def _t(shape, dtype, device, fmt=torch.contiguous_format, fill=1.0):
    if dtype is None:
        return None
    t = torch.full(shape, fill, dtype=dtype, device=device)
    return t.contiguous(memory_format=fmt) if len(shape) in (4, 5) else t


def _names(*dtypes) -> str:
    return ",".join(str(d).replace("torch.", "") if d is not None else "None" for d in dtypes)


def _stats(device):
    for layout in ("contiguous", "channels_last"):
        shape, fmt = LAYOUTS[layout]
        for x in FLOATS:
            yield f"{layout}|{_names(x)}", {"input": _t(shape, x, device, fmt), "eps": 1e-5}


def _gather(device):
    shape, _ = LAYOUTS["contiguous"]
    stats = [(None, None)] + list(itertools.product(FLOATS, FLOATS))
    for x, m, i, (rm, rv), n in itertools.product(FLOATS, FLOATS, FLOATS, stats, FLOATS):
        yield f"{_names(x, m, i, rm, rv, n)}", {
            "input": _t(shape, x, device), "mean": _t((W, C), m, device), "invstd": _t((W, C), i, device),
            "running_mean": _t((C,), rm, device, fill=0.0), "running_var": _t((C,), rv, device), "momentum": 0.1,
            "eps": 1e-5, "counts": _t((W,), n, device, fill=4.0)}


def _elemt(device):
    for layout, (shape, fmt) in LAYOUTS.items():
        for x, w, b, m, i in itertools.product(FLOATS, OPTIONAL, OPTIONAL, FLOATS, FLOATS):
            yield f"{layout}|{_names(x, w, b, m, i)}", {
                "input": _t(shape, x, device, fmt), "weight": _t((C,), w, device), "bias": _t((C,), b, device),
                "mean": _t((C,), m, device, fill=0.5), "invstd": _t((C,), i, device), "eps": 1e-5}


def _backward_reduce(device):
    for layout, wanted in itertools.product(("contiguous", "channels_last"), (True, False)):
        shape, fmt = LAYOUTS[layout]  # wanted False: no gradient asked for (channels-last computes all anyway)
        for g, x, m, i, w in itertools.product(FLOATS, FLOATS, FLOATS, FLOATS, OPTIONAL):
            yield f"{layout}|wanted={wanted}|{_names(g, x, m, i, w)}", {
                "grad_out": _t(shape, g, device, fmt), "input": _t(shape, x, device, fmt),
                "mean": _t((C,), m, device, fill=0.5), "invstd": _t((C,), i, device), "weight": _t((C,), w, device),
                "input_g": wanted, "weight_g": wanted and w is not None, "bias_g": wanted and w is not None}


def _backward_elemt(device):
    for layout in ("contiguous", "channels_last"):
        shape, fmt = LAYOUTS[layout]
        for g, x, m, i, w, s, sx in itertools.product(FLOATS, FLOATS, FLOATS, FLOATS, OPTIONAL, FLOATS, FLOATS):
            yield f"{layout}|{_names(g, x, m, i, w, s, sx)}", _backward_elemt_args(device, shape, fmt, g, x, m, i, w,
                                                                                    s, sx, torch.int32)
        for count in (torch.int64, torch.float32):  # the count must be int32
            yield f"{layout}|count={_names(count)}", _backward_elemt_args(device, shape, fmt, *(torch.float32,) * 7,
                                                                           count)


def _backward_elemt_args(device, shape, fmt, g, x, m, i, w, s, sx, count):
    return {"grad_out": _t(shape, g, device, fmt), "input": _t(shape, x, device, fmt),
            "mean": _t((C,), m, device, fill=0.5), "invstd": _t((C,), i, device), "weight": _t((C,), w, device),
            "sum_dy": _t((C,), s, device), "sum_dy_xmu": _t((C,), sx, device), "count": _t((W,), count, device,
                                                                                          fill=8)}


CALLS = {"batch_norm_stats": _stats, "batch_norm_gather_stats_with_counts": _gather, "batch_norm_elemt": _elemt,
         "batch_norm_backward_reduce": _backward_reduce, "batch_norm_backward_elemt": _backward_elemt}


def _dtypes(out) -> list:
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return [str(t.dtype) if isinstance(t, torch.Tensor) else None for t in outs]


def observed(device: str) -> dict:
    """What ``torch.ops.aten.<op>`` does with every call: ``[op, key] -> ["ok", dtypes]`` or ``["raise", ...]``."""
    seen = {}
    for op, make in CALLS.items():
        fn = getattr(torch.ops.aten, op).default
        for key, args in make(device):
            try:
                seen[f"{op}|{key}"] = ["ok", _dtypes(fn(**args))]
            except (RuntimeError, NotImplementedError) as exc:  # what the contract speaks of; others fail the test
                seen[f"{op}|{key}"] = ["raise", type(exc).__name__, str(exc)]
    return seen


def expected(device: str) -> dict:
    """What the contract says of the same calls, with the messages CUDA may raise first."""
    said = {}
    for op, make in CALLS.items():
        for key, args in make(device):
            v = cuda_contract.verdict(op, args)
            r = v.refusal
            said[f"{op}|{key}"] = (["ok", [str(d) if d is not None else None for d in v.outputs]] if r is None else
                                   ["raise", r.exc_type.__name__, r.message, *r.alternatives])
    return said


def _disagreements(seen: dict, said: dict) -> list:
    out = []
    for key, want in said.items():
        got = seen.get(key)
        agrees = got == want if want[0] == "ok" else (got is not None and got[:2] == want[:2] and got[2] in want[2:])
        if not agrees:
            out.append(f"{key}: contract {want}, kernel {got}")
    return out


SWEEP = """
import importlib.util, json, sys
from harness.impls import torch_emulation
torch_emulation.install()
spec = importlib.util.spec_from_file_location("cuda_contract_sweep", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
json.dump(module.observed("cpu"), sys.stdout)
"""


@pytest.mark.slow(23)
def test_the_emulated_kernels_refuse_exactly_what_the_contract_says(kernels):
    """Every combination: CUDA's exception type and message where the contract refuses, its output dtypes else."""
    done = subprocess.run([sys.executable, "-c", SWEEP, __file__], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    seen, said = json.loads(done.stdout), expected("cpu")
    assert seen.keys() == said.keys()
    wrong = _disagreements(seen, said)
    assert not wrong, f"{len(wrong)} of {len(said)} calls disagree with the contract, e.g.\n" + "\n".join(wrong[:15])
    refused = sum(v[0] == "raise" for v in said.values())
    assert 0 < refused < len(said), f"{refused} of {len(said)} refused: the sweep does not exercise both sides"


@pytest.mark.cuda
def test_the_contract_is_what_cuda_does():
    """The table against torch's real CUDA kernels, over the same combinations (needs a GPU)."""
    seen, said = observed("cuda"), expected("cuda")
    wrong = _disagreements(seen, said)
    assert not wrong, (f"{len(wrong)} of {len(said)} calls: CUDA differs from the contract (read from "
                       f"{cuda_contract.READ_FROM}) on torch {torch.__version__}, e.g.\n" + "\n".join(wrong[:15]))


@pytest.mark.cuda
def test_batchnorms_refusals_are_what_cuda_does():
    """The other half of ``unsupported``: where the contract says ``nn.BatchNorm`` on CUDA refuses a dtype pair, it
    raises; where it says it accepts, a training step runs (needs a GPU). Every input and parameter dtype, with and
    without weights, 2-D and 4-D."""
    wrong = []
    for x_dt, p_dt, affine, ndim in itertools.product(FLOATS, FLOATS, (True, False), (2, 4)):
        names = (str(x_dt).split(".")[1], str(p_dt).split(".")[1])
        said = plain_layer.refusal_on_cuda(*names, affine, ndim)
        layer = torch.nn.BatchNorm1d(C, affine=affine) if ndim == 2 else torch.nn.BatchNorm2d(C, affine=affine)
        layer = layer.to("cuda", p_dt).train()
        x = torch.randn((4, C) + (3,) * (ndim - 2), device="cuda").to(x_dt)
        try:
            layer(x)
            torch.cuda.synchronize()
            seen = None
        except RuntimeError as e:
            seen = str(e).splitlines()[0]
        if (said is None) != (seen is None):
            wrong.append(f"{names} affine={affine} {ndim}-D: contract {'accepts' if said is None else 'refuses'}, "
                         f"CUDA {'accepts' if seen is None else 'raises ' + seen!r}")
    assert not wrong, f"{len(wrong)} of 64 disagree on torch {torch.__version__}:\n" + "\n".join(wrong)


def _v(op, **args):
    return cuda_contract.verdict(op, args)


def _x(dtype, layout="contiguous"):
    shape, fmt = LAYOUTS[layout]
    return _t(shape, dtype, "cpu", fmt)


F16, BF16, F32, F64 = FLOATS


@pytest.mark.parametrize("op, args, exc, message", [
    ("batch_norm_stats", lambda: {"input": _x(F32).int(), "eps": 1e-5}, NotImplementedError,
     "\"batch_norm_stats_cuda\" not implemented for 'Int'"),
    ("batch_norm_gather_stats_with_counts",  # the published false pass: the dispatch follows the running stats
     lambda: {"input": _x(F32), "mean": _t((W, C), F32, "cpu"), "invstd": _t((W, C), F32, "cpu"),
              "running_mean": _t((C,), F64, "cpu"), "running_var": _t((C,), F64, "cpu"),
              "counts": _t((W,), F64, "cpu")}, RuntimeError, "Expected mean to have type Double but got Float"),
    ("batch_norm_gather_stats_with_counts",  # no running stats: the input's dtype, so float counts are refused
     lambda: {"input": _x(F16), "mean": _t((W, C), F32, "cpu"), "invstd": _t((W, C), F32, "cpu"),
              "running_mean": None, "running_var": None, "counts": _t((W,), F32, "cpu")}, RuntimeError,
     "Expected counts to have type Half but got Float"),
    ("batch_norm_gather_stats_with_counts",  # CUDA's message names running_var "running_mean"
     lambda: {"input": _x(F32), "mean": _t((W, C), F32, "cpu"), "invstd": _t((W, C), F32, "cpu"),
              "running_mean": _t((C,), F32, "cpu"), "running_var": _t((C,), F64, "cpu"),
              "counts": _t((W,), F32, "cpu")}, RuntimeError, "Expected running_mean to have type Float but got Double"),
    ("batch_norm_elemt", lambda: {"input": _x(F32), "weight": _t((C,), F64, "cpu"), "bias": _t((C,), F64, "cpu"),
                                  "mean": _t((C,), F32, "cpu"), "invstd": _t((C,), F32, "cpu")},
     RuntimeError, "Expected weight to have type Float but got Double"),
    ("batch_norm_elemt", lambda: {"input": _x(F32, "channels_last"), "weight": _t((C,), F64, "cpu"), "bias": None,
                                  "mean": _t((C,), F32, "cpu"), "invstd": _t((C,), F32, "cpu")},
     RuntimeError, "expected scalar type Float but found Double"),
    ("batch_norm_backward_reduce", lambda: {"grad_out": _x(F32), "input": _x(F32), "mean": _t((C,), F32, "cpu"),
                                            "invstd": _t((C,), F64, "cpu"), "weight": None, "input_g": True,
                                            "weight_g": False, "bias_g": False},
     RuntimeError, "mean and invstd need to have the same data types"),
    ("batch_norm_backward_elemt", lambda: {"grad_out": _x(F16), "input": _x(F16), "mean": _t((C,), F16, "cpu"),
                                           "invstd": _t((C,), F16, "cpu"), "weight": None,
                                           "sum_dy": _t((C,), F16, "cpu"), "sum_dy_xmu": _t((C,), F16, "cpu"),
                                           "count": _t((W,), torch.int32, "cpu")},
     RuntimeError, "Expected mean to have type Float but got Half"),
    ("batch_norm_backward_elemt", lambda: {"grad_out": _x(F32), "input": _x(F32), "mean": _t((C,), F32, "cpu"),
                                           "invstd": _t((C,), F32, "cpu"), "weight": None,
                                           "sum_dy": _t((C,), F32, "cpu"), "sum_dy_xmu": _t((C,), F32, "cpu"),
                                           "count": _t((W,), F32, "cpu")},
     RuntimeError, "expected scalar type Int but found Float"),
])
def test_refusals_read_from_the_cuda_sources(op, args, exc, message):
    r = _v(op, **args()).refusal
    assert r is not None and (r.exc_type, r.message) == (exc, message), r


@pytest.mark.parametrize("op, args, outputs", [
    ("batch_norm_stats", lambda: {"input": _x(BF16), "eps": 1e-5}, (F32, F32)),
    ("batch_norm_gather_stats_with_counts",  # half input, float32 running stats and counts: the supported mix
     lambda: {"input": _x(F16), "mean": _t((W, C), F32, "cpu"), "invstd": _t((W, C), F32, "cpu"),
              "running_mean": _t((C,), F32, "cpu"), "running_var": _t((C,), F32, "cpu"),
              "counts": _t((W,), F32, "cpu")}, (F32, F32)),
    ("batch_norm_elemt", lambda: {"input": _x(F16), "weight": _t((C,), F32, "cpu"), "bias": _t((C,), F32, "cpu"),
                                  "mean": _t((C,), F32, "cpu"), "invstd": _t((C,), F32, "cpu")}, (F16,)),
    ("batch_norm_elemt",  # channels_last_3d takes the general path, which casts any operand
     lambda: {"input": _x(F32, "channels_last_3d"), "weight": _t((C,), F64, "cpu"), "bias": None,
              "mean": _t((C,), F64, "cpu"), "invstd": _t((C,), F16, "cpu")}, (F32,)),
    ("batch_norm_backward_reduce", lambda: {"grad_out": _x(F16), "input": _x(F16), "mean": _t((C,), F32, "cpu"),
                                            "invstd": _t((C,), F32, "cpu"), "weight": _t((C,), F32, "cpu"),
                                            "input_g": True, "weight_g": True, "bias_g": True}, (F32,) * 4),
])
def test_acceptances_read_from_the_cuda_sources(op, args, outputs):
    v = _v(op, **args())
    assert v.refusal is None and v.outputs == outputs, v


def _case(case_id):
    (case,) = catalog.select([case_id])
    return case


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_torch_adapter_declares_unsupported_what_cuda_refuses(device):
    reason = TorchImpl().unsupported_reason(_case("mixed-precision/uneven/float32-float64/ws2"), device)
    assert reason is not None
    for part in ("aten::batch_norm_gather_stats_with_counts", "RuntimeError: Expected mean to have type Double but "
                 "got Float", "float32 input with float64 parameters", "nn.BatchNorm on CUDA refuses it too"):
        assert part in reason, reason
    assert TorchImpl().unsupported_reason(_case("mixed-precision/uneven/float16-float32/ws2"), device) is None


def test_the_reason_is_derived_from_the_contract(monkeypatch):
    """Not a parallel rule: with a contract that accepts everything, nothing is unsupported."""
    case = _case("mixed-precision/uneven/float32-float64/ws2")
    monkeypatch.setattr(cuda_plan, "verdict", lambda op, args: cuda_contract.Verdict(op, "any", None, (F32, F32)))
    assert TorchImpl().unsupported_reason(case, "cpu") is None


def test_syncbn_stricter_than_batchnorm_runs_and_fails():
    """Half input without running statistics: the gather refuses float counts, nn.BatchNorm (cuDNN) does not. That is
    not a limitation to declare but a finding: the case stays supported, and the contract's refusal is CUDA's."""
    from dataclasses import replace

    case = replace(_case("mixed-precision/uneven/float16-float32/ws2"), track_running_stats=False)
    assert TorchImpl().unsupported_reason(case, "cuda") is None
    refusal = cuda_plan.syncbn_refusal(case)
    assert refusal is not None and "Expected counts to have type Half but got Float" in str(refusal), refusal
    assert plain_layer.refusal_on_cuda("float16", "float32", True, 4) is None


def test_only_synchronized_training_calls_the_ops():
    from dataclasses import replace

    case = _case("mixed-precision/uneven/float32-float64/ws2")
    assert cuda_plan.syncbn_refusal(replace(case, steps=("eval",))) is None
    assert cuda_plan.syncbn_refusal(replace(case, groups=((0,), (1,)))) is None


@pytest.mark.skipif(tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 1),
                    reason="the casts came with pytorch#98332 in torch 2.1")
def test_the_installed_function_casts_counts_and_weight():
    assert cuda_plan.function_casts() == (True, True), "torch >= 2.1's SyncBN Function casts both (#98332)"


def test_verdict_of_an_unknown_op_names_the_known_ones():
    with pytest.raises(KeyError, match="batch_norm_elemt"):
        cuda_contract.verdict("batch_norm_update_stats", {})


def test_plain_batch_norm_steps_are_unsupported_where_batchnorm_refuses():
    """A group of one rank calls the plain batch norm, which on CUDA refuses float64 weights for float32 input
    (cuDNN): a documented limitation, as in the synchronized case (the CUDA search's `ws2-187abc2c` was an error)."""
    from dataclasses import replace

    case = _case("mixed-precision/uneven/float32-float64/ws2")
    for alone in (replace(case, groups=((0,), (1,))), replace(case, steps=("eval",))):
        assert cuda_plan.syncbn_refusal(alone) is None
        reason = TorchImpl().unsupported_reason(alone, "cuda")
        assert reason is not None and "call the plain batch norm" in reason, reason
    no_weights = replace(case, groups=((0,), (1,)), affine=False)  # nn.BatchNorm accepts: nothing to declare
    assert TorchImpl().unsupported_reason(no_weights, "cuda") is None
