"""Every syncbn_ref op against a plain-torch float64 reference, and torch.library.opcheck (CPU kernels).

Shapes, dtypes and layouts are drawn by hypothesis, including channel counts
that are not powers of two and above 64, N*spatial == 1, and large offsets
(strategies shared with the CUDA kernel tests: tests/support/kernel_inputs.py;
the CUDA kernels are tested in test_cuda_kernels.py).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from kernel_inputs import OPCHECK_CASES, SETTINGS, finish_reference, inputs, ref_stats, running_buffers
from kernel_inputs import acc_dtype as _acc
from kernel_inputs import assert_close_u as _close
from kernel_inputs import layout_of as _fmt
from kernel_inputs import per_channel as _chan
from kernel_inputs import reduce_dims as _dims


@SETTINGS
@given(inputs())
def test_batch_norm_stats(kernels, drawn):
    x, _ = drawn
    mean, invstd = kernels.batch_norm_stats(x, 1e-5)
    want_mean, want_invstd = ref_stats(x, 1e-5)
    assert mean.dtype == invstd.dtype == _acc(x.dtype)
    _close(mean, want_mean, mean.dtype, scale=float(want_mean.abs().max()) + 1)
    _close(invstd, want_invstd, mean.dtype, scale=float(want_invstd.abs().max()))


@SETTINGS
@given(inputs(), st.floats(0.0, 1.0), st.booleans())
def test_gather_stats_with_counts(kernels, drawn, momentum, with_running):
    x, g = drawn
    world = 3
    xs = [x.double() + float(torch.randn((), generator=g)) for _ in range(world)]
    counts = [x.numel() // x.shape[1]] * world
    counts[1] = 0  # an empty rank contributes nothing
    stats = [ref_stats(xi, 1e-5) for xi in xs]
    acc = _acc(x.dtype)
    mean = torch.stack([s[0] for s in stats]).to(acc)
    invstd = torch.stack([s[1] for s in stats]).to(acc)
    c = x.shape[1]
    rm = torch.randn(c, generator=g, dtype=torch.float64).to(acc) if with_running else None
    rv = torch.rand(c, generator=g, dtype=torch.float64).to(acc) + 0.5 if with_running else None
    rm0, rv0 = (rm.clone(), rv.clone()) if with_running else (None, None)
    cnt = torch.tensor(counts, dtype=acc)
    got_mean, got_invstd = kernels.batch_norm_gather_stats_with_counts(x, mean, invstd, rm, rv, momentum, 1e-5, cnt)
    # Reference: the merged moments of the non-empty ranks' (rounded) statistics.
    m64, i64, n = mean.double(), invstd.double(), torch.tensor(counts, dtype=torch.float64)
    var = 1.0 / i64**2 - 1e-5
    total = n.sum()
    gmean = (n[:, None] * m64).sum(0) / total
    gvar = (n[:, None] * (var + (m64 - gmean) ** 2)).sum(0) / total
    assert got_mean.dtype == got_invstd.dtype == acc
    _close(got_mean, gmean, acc, scale=float(gmean.abs().max()) + 1)
    _close(got_invstd, 1.0 / torch.sqrt(gvar + 1e-5), acc, scale=float(i64.max()))
    if with_running and total > 1:
        _close(rm, (1 - momentum) * rm0.double() + momentum * gmean, acc, scale=float(gmean.abs().max()) + 1)
        unbiased = gvar * total / (total - 1)
        _close(rv, (1 - momentum) * rv0.double() + momentum * unbiased, acc, scale=float(unbiased.max()) + 1)


@SETTINGS
@given(inputs(allow_empty=True), st.booleans(), st.sampled_from([None, torch.float32, "input"]))
def test_batch_norm_elemt(kernels, drawn, affine, wdtype):
    x, g = drawn
    c = x.shape[1]
    wdtype = x.dtype if wdtype == "input" else (wdtype or torch.float32)
    w = torch.randn(c, generator=g, dtype=torch.float64).to(wdtype) if affine else None
    b = torch.randn(c, generator=g, dtype=torch.float64).to(wdtype) if affine else None
    mean = x.double().mean(_dims(x)) if x.numel() else torch.zeros(c, dtype=torch.float64)
    invstd = torch.rand(c, generator=g, dtype=torch.float64) + 0.5
    mean, invstd = mean.to(_acc(x.dtype)), invstd.to(_acc(x.dtype))
    out = kernels.batch_norm_elemt(x, w, b, mean, invstd, 1e-5)
    w64 = w.double() if affine else torch.ones(c, dtype=torch.float64)
    b64 = b.double() if affine else torch.zeros(c, dtype=torch.float64)
    want = (x.double() - _chan(mean.double(), x)) * _chan(invstd.double() * w64, x) + _chan(b64, x)
    assert out.dtype == x.dtype and out.shape == x.shape
    assert out.is_contiguous(memory_format=_fmt(x))
    scale = float(want.abs().max()) + 1 if want.numel() else 1.0
    _close(out, want.to(x.dtype), x.dtype, scale=scale)


@SETTINGS
@given(inputs(), st.booleans(), st.booleans())
def test_backward_reduce_and_elemt(kernels, drawn, affine, grad_other_layout):
    x, g = drawn
    c = x.shape[1]
    dy = torch.randn(x.shape, generator=g, dtype=torch.float64).to(x.dtype)
    if grad_other_layout:
        dy = dy.contiguous()  # a gradient laid out differently from a channels-last input
    else:
        dy = dy.contiguous(memory_format=_fmt(x))
    w = torch.randn(c, generator=g, dtype=torch.float64).float() if affine else None
    mean, invstd = kernels.batch_norm_stats(x, 1e-5)
    sum_dy, sum_dy_xmu, gw, gb = kernels.batch_norm_backward_reduce(dy, x, mean, invstd, w, True, affine, affine)
    x64, dy64 = x.double(), dy.double()
    xmu = x64 - _chan(mean.double(), x)
    want_s = dy64.sum(_dims(x))
    want_sx = (dy64 * xmu).sum(_dims(x))
    acc = mean.dtype
    assert sum_dy.dtype == sum_dy_xmu.dtype == acc
    _close(sum_dy, want_s, acc, scale=float(dy64.abs().sum(_dims(x)).max()) + 1)
    _close(sum_dy_xmu, want_sx, acc, scale=float((dy64 * xmu).abs().sum(_dims(x)).max()) + 1)
    if affine:
        assert gw.dtype == gb.dtype == w.dtype
        _close(gw, want_sx * invstd.double(), acc, scale=float((want_sx.abs() * invstd.double()).max()) + 1)
        _close(gb, want_s, acc, scale=float(dy64.abs().sum(_dims(x)).max()) + 1)
    else:
        assert gw is None and gb is None
    n = x.numel() // c
    count = torch.tensor([n, 0], dtype=torch.int32)  # a second, empty rank adds nothing
    gi = kernels.batch_norm_backward_elemt(dy, x, mean, invstd, w, sum_dy, sum_dy_xmu, count)
    w64 = w.double() if affine else torch.ones(c, dtype=torch.float64)
    i64 = invstd.double()
    want = (dy64 - _chan(sum_dy.double() / n, x) - xmu * _chan(sum_dy_xmu.double() / n * i64**2, x)) \
        * _chan(i64 * w64, x)
    assert gi.dtype == x.dtype and gi.is_contiguous(memory_format=_fmt(x))
    _close(gi, want.to(x.dtype), x.dtype, scale=float(want.abs().max()) + 1)


@SETTINGS
@given(inputs(allow_empty=True))
def test_welford_stats_and_merge(kernels, drawn):
    x, g = drawn
    c = x.shape[1]
    parts = [x, x[:0], x.double().add(5.0).to(x.dtype)]  # the middle rank is empty
    rows = torch.stack([kernels.welford_stats(p) for p in parts])
    assert rows.dtype == torch.float64 and rows.shape == (3, 2 * c + 1)
    for p, row in zip(parts, rows):
        n = p.numel() // c
        assert row[0] == n
        if n:
            p64 = p.double()
            torch.testing.assert_close(row[1:1 + c], p64.mean(_dims(p)), rtol=1e-12, atol=1e-9)
            m2 = ((p64 - _chan(p64.mean(_dims(p)), p)) ** 2).sum(_dims(p))
            torch.testing.assert_close(row[1 + c:], m2, rtol=1e-10, atol=1e-9)
    merged = kernels.welford_merge(rows)
    allx = torch.cat([p.double().transpose(0, 1).reshape(c, -1) for p in parts], dim=1)
    assert merged[0] == allx.shape[1]
    if allx.shape[1]:
        torch.testing.assert_close(merged[1:1 + c], allx.mean(1), rtol=1e-12, atol=1e-9)
        want_m2 = ((allx - allx.mean(1, keepdim=True)) ** 2).sum(1)
        torch.testing.assert_close(merged[1 + c:], want_m2, rtol=1e-10, atol=1e-8)


@SETTINGS
@given(inputs(), st.floats(0.0, 1.0), st.sampled_from([None, torch.float32, torch.float16, torch.float64]))
def test_welford_finish(kernels, drawn, momentum, running_dtype):
    """From a merged row: the mean, invstd and running statistics of the reference module's former Python, bit
    for bit (same ATen operations), the buffers in their own dtype."""
    x, g = drawn
    c = x.shape[1]
    row = kernels.welford_stats(x)
    rm, rv = running_buffers(c, g, running_dtype)
    want_rm, want_rv = (rm.clone(), rv.clone()) if rm is not None else (None, None)
    mean, invstd = kernels.welford_finish(row, rm, rv, momentum, 1e-5)
    want = finish_reference(row, want_rm, want_rv, momentum, 1e-5)
    assert mean.dtype == invstd.dtype == torch.float64 and mean.shape == (c,)
    torch.testing.assert_close(mean, want[0], rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(invstd, want[1], rtol=0, atol=0, equal_nan=True)
    if rm is not None:
        assert rm.dtype == rv.dtype == running_dtype
        torch.testing.assert_close(rm, want_rm, rtol=0, atol=0)
        torch.testing.assert_close(rv, want_rv, rtol=0, atol=0)


@pytest.mark.parametrize("count,want", [(0.0, (0.0, 1.0)), (1.0, (float("nan"), float("nan")))],
                         ids=["all-empty", "one-value"])
def test_welford_finish_below_two_values_keeps_the_running_statistics(kernels, count, want):
    """count 0 (every rank empty): mean 0, invstd 1; count 1 (refused by the module where it can read the count):
    NaN. The running statistics stay as they were in both."""
    row = torch.tensor([count, 3.0, 4.0, 0.0, 0.0], dtype=torch.float64)
    rm, rv = torch.tensor([1.0, 2.0]), torch.tensor([5.0, 6.0])
    mean, invstd = kernels.welford_finish(row, rm, rv, 0.5, 1e-5)
    torch.testing.assert_close(mean, torch.full((2,), want[0], dtype=torch.float64), equal_nan=True)
    torch.testing.assert_close(invstd, torch.full((2,), want[1], dtype=torch.float64), equal_nan=True)
    assert rm.tolist() == [1.0, 2.0] and rv.tolist() == [5.0, 6.0]


def test_large_offset_variance_is_not_cancelled(kernels):
    """A mean of 1e4 against a spread of 1e-2 in float32: E[x^2]-E[x]^2 would lose every digit."""
    g = torch.Generator().manual_seed(0)
    x = (1e4 + 1e-2 * torch.randn(64, 5, 8, 8, generator=g, dtype=torch.float64)).float()
    _, invstd = kernels.batch_norm_stats(x, 0.0)
    want = 1.0 / x.double().var((0, 2, 3), unbiased=False).sqrt()
    torch.testing.assert_close(invstd.double(), want, rtol=1e-5, atol=0)


def test_layouts_agree(kernels):
    """The same values in NCHW and NHWC memory give the same statistics and outputs."""
    x = torch.randn(6, 67, 5, 3) * 3 + 1
    xl = x.contiguous(memory_format=torch.channels_last)
    for op in ("batch_norm_stats",):
        a = getattr(kernels, op)(x, 1e-5)
        b = getattr(kernels, op)(xl, 1e-5)
        for u, v in zip(a, b):
            torch.testing.assert_close(u, v, rtol=2e-7, atol=0)
    rows = kernels.welford_stats(x), kernels.welford_stats(xl)
    torch.testing.assert_close(rows[0], rows[1], rtol=1e-13, atol=1e-12)


def test_caller_errors_name_the_value(kernels):
    with pytest.raises(RuntimeError, match="at least 2 dims"):
        kernels.batch_norm_stats(torch.randn(5), 1e-5)
    with pytest.raises(RuntimeError, match="one entry per gathered row"):
        kernels.batch_norm_gather_stats_with_counts(torch.randn(2, 3), torch.zeros(2, 3), torch.ones(2, 3), None,
                                                    None, 0.1, 1e-5, torch.ones(3))
    with pytest.raises(RuntimeError, match="2\\*C\\+1"):
        kernels.welford_merge(torch.zeros(2, 4, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="welford_finish expects one \\[2\\*C\\+1\\] row"):
        kernels.welford_finish(torch.zeros(4, dtype=torch.float64), None, None, 0.1, 1e-5)
    with pytest.raises(RuntimeError, match="welford_finish expects a float64 row"):
        kernels.welford_finish(torch.zeros(5), None, None, 0.1, 1e-5)


@pytest.mark.skipif(not hasattr(torch.library, "opcheck"), reason="torch.library.opcheck needs torch >= 2.4")
@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last], ids=["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["float32", "float16"])
@pytest.mark.parametrize("op,make", OPCHECK_CASES, ids=[f"{o}-{i}" for i, (o, _) in enumerate(OPCHECK_CASES)])
def test_opcheck(kernels, op, make, dtype, fmt):
    x = (torch.randn(4, 67, 3, 5) * 2 + 1).to(dtype).contiguous(memory_format=fmt)
    result = torch.library.opcheck(getattr(kernels, op).default, make(x, kernels))
    assert all(v == "SUCCESS" for v in result.values()), result


@pytest.mark.skipif(not hasattr(torch.library, "opcheck"), reason="torch.library.opcheck needs torch >= 2.4")
@pytest.mark.parametrize("shape", [(6, 5), (2, 3, 4, 2, 3)], ids=["2d", "5d"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64], ids=["bfloat16", "float64"])
@pytest.mark.parametrize("op,make", OPCHECK_CASES, ids=[f"{o}-{i}" for i, (o, _) in enumerate(OPCHECK_CASES)])
def test_opcheck_other_ranks_and_dtypes(kernels, op, make, dtype, shape):
    """The fake kernels torch.compile traces with agree with the real ones beyond 4-D float32/float16 input."""
    x = (torch.randn(*shape) * 2 + 1).to(dtype)
    result = torch.library.opcheck(getattr(kernels, op).default, make(x, kernels))
    assert all(v == "SUCCESS" for v in result.values()), result
