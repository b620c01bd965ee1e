"""The reference's CUDA kernels against the float64 truth and against its CPU kernels, and torch.library.opcheck.

Every test here is marked ``cuda``: skipped, with the reason, where torch sees
no GPU; ``nox -s gpu`` builds the kernels for the GPU present and runs them.
Inputs come from the CPU tests' strategies (tests/support/kernel_inputs.py),
widened to 1..2048 channels and empty batches; few channels with many
elements each (the CUDA reductions split a channel over blocks and merge the
partials); and more than 2^24 elements per channel (where a float32 count is
no longer exact). Each CUDA result is compared with the float64 truth within a
few roundings of its dtype (for statistics, plus the float64 arithmetic's own
error, which grows with a channel's offset over its spread), and with the CPU
kernel's result on the same input: both accumulate in float64, so statistics
agree to a few roundings of their dtype and elementwise outputs to a few
roundings of the output dtype (the CPU computes those in float, the GPU in
double: they are not bit-identical).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_inputs import (OPCHECK_CASES, SETTINGS, U, WIDE_CHANNELS, acc_dtype, assert_close_u, finish_reference,
                           inputs, layout_of, long_inputs, per_channel, reduce_dims, ref_stats, running_buffers)

pytestmark = pytest.mark.cuda
DEV = "cuda"
CUDA_SETTINGS = settings(SETTINGS, max_examples=25)
EPS = 1e-5


def on_dev(t):
    return None if t is None else t.to(DEV)


def _scale(t) -> float:
    return float(t.double().abs().max()) + 1 if t.numel() else 1.0


def close_stats(mean, invstd, want_mean, want_invstd, acc):
    """Statistics within a few roundings of their dtype, plus the float64 arithmetic's own error, which grows with
    a channel's offset over its spread (|mean| * invstd) for any float64 algorithm (a few 1e-14 at 1000)."""
    want_mean, want_invstd = want_mean.double().cpu(), want_invstd.double().cpu()
    cond = float((want_mean.abs() * want_invstd).max())
    rtol = 4 * U[acc] + 64 * 2.0**-53 * (1 + cond)
    spread = float((1 / want_invstd).max())
    torch.testing.assert_close(mean.double().cpu(), want_mean, rtol=rtol,
                               atol=rtol * (float(want_mean.abs().max()) + spread))
    torch.testing.assert_close(invstd.double().cpu(), want_invstd, rtol=rtol, atol=0)


def check_stats(kernels, x):
    """batch_norm_stats on the GPU: dtype, device, the float64 truth, the CPU kernel; empty input gives (0, NaN)."""
    mean, invstd = kernels.batch_norm_stats(x.to(DEV), EPS)
    acc = acc_dtype(x.dtype)
    assert mean.dtype == invstd.dtype == acc and mean.device.type == invstd.device.type == DEV
    cpu_mean, cpu_invstd = kernels.batch_norm_stats(x, EPS)
    if x.numel() == 0:
        assert bool((mean.cpu() == 0).all()) and bool(invstd.cpu().isnan().all())
        assert bool(cpu_invstd.isnan().all())
        return
    close_stats(mean, invstd, *ref_stats(x, EPS), acc)
    close_stats(mean, invstd, cpu_mean, cpu_invstd, acc)


def check_welford(kernels, x):
    """welford_stats rows of x, an empty rank and a shifted copy; their merge; all against float64 and the CPU."""
    c = x.shape[1]
    parts = [x, x[:0], x.double().add(5.0).to(x.dtype)]
    rows = torch.stack([kernels.welford_stats(p.to(DEV)) for p in parts])
    assert rows.device.type == DEV and rows.dtype == torch.float64 and rows.shape == (3, 2 * c + 1)
    cpu_rows = torch.stack([kernels.welford_stats(p) for p in parts])
    torch.testing.assert_close(rows.cpu(), cpu_rows, rtol=1e-12, atol=1e-9)
    for p, row in zip(parts, rows.cpu()):
        n = p.numel() // c
        assert row[0] == n
        if n:
            p64 = p.double()
            mean = p64.mean(reduce_dims(p))
            torch.testing.assert_close(row[1:1 + c], mean, rtol=1e-12, atol=1e-9)
            m2 = ((p64 - per_channel(mean, p)) ** 2).sum(reduce_dims(p))
            torch.testing.assert_close(row[1 + c:], m2, rtol=1e-10, atol=1e-9)
    merged = kernels.welford_merge(rows)
    assert merged.device.type == DEV
    torch.testing.assert_close(merged.cpu(), kernels.welford_merge(cpu_rows), rtol=1e-12, atol=1e-9)
    assert merged[0].item() == sum(p.numel() // c for p in parts)


def check_backward(kernels, x, g, affine, grad_other_layout):
    """batch_norm_backward_reduce and _elemt on the GPU against float64 and the CPU, from the same statistics."""
    c = x.shape[1]
    dy = torch.randn(x.shape, generator=g, dtype=torch.float64).to(x.dtype)
    dy = dy.contiguous() if grad_other_layout else dy.contiguous(memory_format=layout_of(x))
    w = torch.randn(c, generator=g, dtype=torch.float64).float() if affine else None
    mean, invstd = kernels.batch_norm_stats(x, EPS)  # the CPU's statistics, so both sides start equal
    got = kernels.batch_norm_backward_reduce(dy.to(DEV), x.to(DEV), mean.to(DEV), invstd.to(DEV), on_dev(w), True,
                                             affine, affine)
    cpu = kernels.batch_norm_backward_reduce(dy, x, mean, invstd, w, True, affine, affine)
    x64, dy64 = x.double(), dy.double()
    xmu = x64 - per_channel(mean.double(), x)
    want_s, want_sx = dy64.sum(reduce_dims(x)), (dy64 * xmu).sum(reduce_dims(x))
    s_scale = float(dy64.abs().sum(reduce_dims(x)).max()) + 1
    sx_scale = float((dy64 * xmu).abs().sum(reduce_dims(x)).max()) + 1
    acc = mean.dtype
    sum_dy, sum_dy_xmu, gw, gb = got
    assert sum_dy.dtype == sum_dy_xmu.dtype == acc and sum_dy.device.type == DEV
    assert_close_u(sum_dy, want_s, acc, scale=s_scale)
    assert_close_u(sum_dy_xmu, want_sx, acc, scale=sx_scale)
    assert_close_u(sum_dy, cpu[0], acc, scale=s_scale)
    assert_close_u(sum_dy_xmu, cpu[1], acc, scale=sx_scale)
    if affine:
        assert gw.dtype == gb.dtype == w.dtype and gw.device.type == DEV
        gw_scale = float((want_sx.abs() * invstd.double()).max()) + 1
        wd = w.dtype  # grad_weight and grad_bias come in the weight's dtype
        assert_close_u(gw, want_sx * invstd.double(), wd, scale=gw_scale)
        assert_close_u(gb, want_s, wd, scale=s_scale)
        assert_close_u(gw, cpu[2], wd, scale=gw_scale)
        assert_close_u(gb, cpu[3], wd, scale=s_scale)
    else:
        assert gw is None and gb is None
    n = x.numel() // c
    count = torch.tensor([n, 0], dtype=torch.int32)  # a second, empty rank adds nothing
    gi = kernels.batch_norm_backward_elemt(dy.to(DEV), x.to(DEV), mean.to(DEV), invstd.to(DEV), on_dev(w),
                                           cpu[0].to(DEV), cpu[1].to(DEV), count.to(DEV))
    gi_cpu = kernels.batch_norm_backward_elemt(dy, x, mean, invstd, w, cpu[0], cpu[1], count)
    w64 = w.double() if affine else torch.ones(c, dtype=torch.float64)
    i64 = invstd.double()
    want = (dy64 - per_channel(cpu[0].double() / n, x)
            - xmu * per_channel(cpu[1].double() / n * i64**2, x)) * per_channel(i64 * w64, x)
    assert gi.dtype == x.dtype and gi.device.type == DEV and gi.is_contiguous(memory_format=layout_of(x))
    assert_close_u(gi, want.to(x.dtype), x.dtype, scale=_scale(want))
    assert_close_u(gi, gi_cpu, x.dtype, scale=_scale(want), units=8)


@CUDA_SETTINGS
@given(inputs(allow_empty=True, channels=WIDE_CHANNELS))
def test_stats(kernels, drawn):
    check_stats(kernels, drawn[0])


@CUDA_SETTINGS
@given(inputs(allow_empty=True, channels=WIDE_CHANNELS))
def test_welford_stats_and_merge(kernels, drawn):
    check_welford(kernels, drawn[0])


@CUDA_SETTINGS
@given(inputs(channels=WIDE_CHANNELS), st.booleans(), st.booleans())
def test_backward_reduce_and_elemt(kernels, drawn, affine, grad_other_layout):
    check_backward(kernels, *drawn, affine, grad_other_layout)


@CUDA_SETTINGS
@given(long_inputs(), st.booleans())
def test_long_channels_split_over_blocks(kernels, drawn, grad_other_layout):
    x, g = drawn
    check_stats(kernels, x)
    check_welford(kernels, x)
    check_backward(kernels, x, g, True, grad_other_layout)


@CUDA_SETTINGS
@given(inputs(allow_empty=True, channels=WIDE_CHANNELS), st.booleans(), st.sampled_from([None, torch.float32, "input"]))
def test_batch_norm_elemt(kernels, drawn, affine, wdtype):
    x, g = drawn
    c = x.shape[1]
    wdtype = x.dtype if wdtype == "input" else (wdtype or torch.float32)
    w = torch.randn(c, generator=g, dtype=torch.float64).to(wdtype) if affine else None
    b = torch.randn(c, generator=g, dtype=torch.float64).to(wdtype) if affine else None
    mean = x.double().mean(reduce_dims(x)) if x.numel() else torch.zeros(c, dtype=torch.float64)
    invstd = torch.rand(c, generator=g, dtype=torch.float64) + 0.5
    mean, invstd = mean.to(acc_dtype(x.dtype)), invstd.to(acc_dtype(x.dtype))
    out = kernels.batch_norm_elemt(x.to(DEV), on_dev(w), on_dev(b), mean.to(DEV), invstd.to(DEV), EPS)
    out_cpu = kernels.batch_norm_elemt(x, w, b, mean, invstd, EPS)
    w64 = w.double() if affine else torch.ones(c, dtype=torch.float64)
    b64 = b.double() if affine else torch.zeros(c, dtype=torch.float64)
    want = (x.double() - per_channel(mean.double(), x)) * per_channel(invstd.double() * w64, x) + per_channel(b64, x)
    assert out.dtype == x.dtype and out.shape == x.shape and out.device.type == DEV
    assert out.is_contiguous(memory_format=layout_of(x))
    assert_close_u(out, want.to(x.dtype), x.dtype, scale=_scale(want))
    assert_close_u(out, out_cpu, x.dtype, scale=_scale(want), units=8)


@CUDA_SETTINGS
@given(inputs(channels=WIDE_CHANNELS), st.floats(0.0, 1.0), st.booleans(), st.booleans())
def test_gather_stats_with_counts(kernels, drawn, momentum, with_running, zero_row):
    """Three ranks' rows, the middle one empty (count 0): as the CPU kernel, and its row gets no weight, even
    when it is torch's empty-rank row of zeros (invstd 0: 1/invstd^2 is infinite)."""
    x, g = drawn
    acc, c = acc_dtype(x.dtype), x.shape[1]
    xs = [x.double() + float(torch.randn((), generator=g)) for _ in range(3)]
    counts = [x.numel() // c, 0, x.numel() // c]
    stats = [ref_stats(xi, EPS) for xi in xs]
    mean = torch.stack([s[0] for s in stats]).to(acc)
    invstd = torch.stack([s[1] for s in stats]).to(acc)
    if zero_row:
        mean[1], invstd[1] = 0, 0
    rm = torch.randn(c, generator=g, dtype=torch.float64).to(acc) if with_running else None
    rv = torch.rand(c, generator=g, dtype=torch.float64).to(acc) + 0.5 if with_running else None
    cnt = torch.tensor(counts, dtype=acc)
    rm_dev, rv_dev = on_dev(rm), on_dev(rv)
    got = kernels.batch_norm_gather_stats_with_counts(x.to(DEV), mean.to(DEV), invstd.to(DEV), rm_dev, rv_dev,
                                                      momentum, EPS, cnt.to(DEV))
    cpu = kernels.batch_norm_gather_stats_with_counts(x, mean, invstd, rm, rv, momentum, EPS, cnt)
    live = torch.tensor(counts) > 0
    m64, i64 = mean.double()[live], invstd.double()[live]
    n = torch.tensor(counts, dtype=torch.float64)[live]
    total = n.sum()
    gmean = (n[:, None] * m64).sum(0) / total
    gvar = (n[:, None] * (1.0 / i64**2 - EPS + (m64 - gmean) ** 2)).sum(0) / total
    assert got[0].dtype == got[1].dtype == acc and got[0].device.type == DEV
    assert_close_u(got[0], gmean, acc, scale=_scale(gmean))
    assert_close_u(got[1], 1.0 / torch.sqrt(gvar + EPS), acc, scale=float(i64.max()))
    for a, b in zip(got, cpu):
        assert_close_u(a, b, acc, scale=_scale(b))
    if with_running:
        assert_close_u(rm_dev, rm, acc, scale=_scale(rm))
        assert_close_u(rv_dev, rv, acc, scale=_scale(rv))


@pytest.mark.parametrize("shape", [(2**24 + 3, 2), (4099, 1, 65, 63)], ids=["2d-rows", "nchw-channels"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["float32", "float16"])
def test_counts_above_2_to_the_24_are_exact(kernels, shape, dtype):
    """More elements per channel than a float32 counts exactly (2^24 + 3 and 4099*65*63): the float64 count,
    statistics and the input gradient's division by the count stay exact to the dtype's rounding."""
    g = torch.Generator().manual_seed(1)
    x = (3.0 + torch.randn(shape, generator=g, dtype=torch.float64)).to(dtype)
    n = x.numel() // x.shape[1]
    assert n > 2**24 and float(torch.tensor(n, dtype=torch.float32)) != n
    row = kernels.welford_stats(x.to(DEV)).cpu()
    assert row[0].item() == n
    check_stats(kernels, x)
    dy = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    mean, invstd = kernels.batch_norm_stats(x, EPS)
    s, sx, _, _ = kernels.batch_norm_backward_reduce(dy, x, mean, invstd, None, True, False, False)
    count = torch.tensor([n], dtype=torch.int32, device=DEV)
    gi = kernels.batch_norm_backward_elemt(dy.to(DEV), x.to(DEV), mean.to(DEV), invstd.to(DEV), None, s.to(DEV),
                                           sx.to(DEV), count)
    x64, dy64, i64 = x.double(), dy.double(), invstd.double()
    xmu = x64 - per_channel(mean.double(), x)
    want = (dy64 - per_channel(s.double() / n, x) - xmu * per_channel(sx.double() / n * i64**2, x)) \
        * per_channel(i64, x)
    assert_close_u(gi, want.to(dtype), dtype, scale=_scale(want))


def test_device_errors_name_the_tensor(kernels):
    x = torch.randn(4, 3, 5, device=DEV)
    mean, invstd = kernels.batch_norm_stats(x, EPS)
    with pytest.raises(RuntimeError, match="grad_out is on cpu but input is on cuda"):
        kernels.batch_norm_backward_reduce(torch.randn(4, 3, 5), x, mean, invstd, None, True, False, False)
    # A count on the host is checked there (no device sync), as on the CPU.
    with pytest.raises(RuntimeError, match="global element count must be positive"):
        kernels.batch_norm_backward_elemt(x, x, mean, invstd, None, mean, mean, torch.zeros(2, dtype=torch.int32))


def test_a_cuda_count_is_summed_on_the_device_without_a_check(kernels):
    """A CUDA count is summed inside the kernel (no host sync, so no check): a total of 0 gives non-finite
    gradients, as torch's own kernel does; a positive one the same gradients as the same count on the host."""
    x = torch.randn(4, 3, 5, device=DEV)
    dy = torch.randn(4, 3, 5, device=DEV)
    mean, invstd = kernels.batch_norm_stats(x, EPS)
    s, sx, _, _ = kernels.batch_norm_backward_reduce(dy, x, mean, invstd, None, True, False, False)
    zero = kernels.batch_norm_backward_elemt(dy, x, mean, invstd, None, s, sx,
                                             torch.zeros(2, dtype=torch.int32, device=DEV))
    assert not bool(torch.isfinite(zero).all())
    for dtype in (torch.int32, torch.int64, torch.float32, torch.float16, torch.float64):
        on_device = kernels.batch_norm_backward_elemt(dy, x, mean, invstd, None, s, sx,
                                                      torch.tensor([20, 0], dtype=dtype, device=DEV))
        on_host = kernels.batch_norm_backward_elemt(dy, x, mean, invstd, None, s, sx,
                                                    torch.tensor([20, 0], dtype=dtype))
        assert torch.equal(on_device, on_host), dtype


def test_device_errors_carry_numbers_and_shapes(kernels):
    """Messages with numbers and shapes raised from the CUDA translation unit, read back whole (formatting a
    number there through an iostream once crashed the process on an H200: see kernels/common.h)."""
    x = torch.randn(4, 3, 5, device=DEV)
    mean, invstd = kernels.batch_norm_stats(x, EPS)
    with pytest.raises(RuntimeError, match=r"mean must have 3 elements \(one per channel\), got 2"):
        kernels.batch_norm_elemt(x, None, None, mean[:2], invstd, EPS)
    with pytest.raises(RuntimeError, match=r"grad_out shape \[4, 3, 4\] differs from input shape \[4, 3, 5\]"):
        kernels.batch_norm_backward_reduce(torch.randn(4, 3, 4, device=DEV), x, mean, invstd, None, True, False,
                                           False)
    with pytest.raises(RuntimeError, match=r"must be \[world_size, C\] of the same shape, got \[2, 3\] and \[1, 3\]"):
        kernels.batch_norm_gather_stats_with_counts(x, mean[None].expand(2, 3), invstd[None], None, None, 0.1, EPS,
                                                    torch.ones(2, device=DEV))
    with pytest.raises(RuntimeError, match=r"global element count must be positive, got 0(?![.\d])"):
        kernels.batch_norm_backward_elemt(x, x, mean, invstd, None, mean, mean, torch.zeros(2, dtype=torch.int32))


@CUDA_SETTINGS
@given(inputs(allow_empty=True, channels=WIDE_CHANNELS), st.floats(0.0, 1.0),
       st.sampled_from([None, torch.float32, torch.float16, torch.bfloat16, torch.float64]))
def test_welford_finish(kernels, drawn, momentum, running_dtype):
    """The merged row's mean and invstd and the running statistics in place, as the CPU kernel (which is the
    reference module's former Python), to the last bit or so; count < 2 included (the drawn empty batches)."""
    x, g = drawn
    c = x.shape[1]
    row = kernels.welford_stats(x)
    rm, rv = running_buffers(c, g, running_dtype)
    rm_dev, rv_dev = on_dev(rm), on_dev(rv)
    got = kernels.welford_finish(row.to(DEV), rm_dev, rv_dev, momentum, EPS)
    want = kernels.welford_finish(row, rm, rv, momentum, EPS)
    assert all(t.device.type == DEV and t.dtype == torch.float64 for t in got)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.cpu(), b, rtol=2**-51, atol=0, equal_nan=True)
    if rm is not None:
        assert rm_dev.dtype == running_dtype
        torch.testing.assert_close(rm_dev.cpu(), rm, rtol=2 * U[running_dtype], atol=0)
        torch.testing.assert_close(rv_dev.cpu(), rv, rtol=2 * U[running_dtype], atol=0)
    ref = finish_reference(row, None, None, momentum, EPS)
    torch.testing.assert_close(got[0].cpu(), ref[0], rtol=2**-51, atol=0, equal_nan=True)


@pytest.mark.parametrize("shape,fmt", [((512, 1, 256, 256), torch.contiguous_format),  # 2^25 in one channel, planes
                                       ((2**25, 1), torch.contiguous_format),  # one column of 2^25 rows
                                       ((128, 8, 128, 256), torch.channels_last),  # rows, vector columns
                                       ((3, 2, 2**22 + 5), torch.contiguous_format)],  # long odd runs
                         ids=["nchw-c1", "2d-c1", "nhwc-c8", "ncl-odd"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=["float32", "float16", "bfloat16"])
def test_large_inputs_split_over_many_blocks(kernels, shape, fmt, dtype):
    """2^25 elements in a channel (hundreds of split partials merged by the last block): statistics, welford rows
    and the backward sums against float64, run twice (the same bits: fixed splits and merge order)."""
    g = torch.Generator().manual_seed(2)
    x64 = 1000.0 + 0.5 * torch.randn(shape, generator=g, dtype=torch.float64)
    x = x64.to(dtype).contiguous(memory_format=fmt)
    xd = x.to(DEV)
    x64 = x.double()
    row = kernels.welford_stats(xd)
    assert torch.equal(row, kernels.welford_stats(xd))
    dims = reduce_dims(x)
    mean = x64.mean(dims)
    m2 = ((x64 - per_channel(mean, x)) ** 2).sum(dims)
    c = x.shape[1]
    torch.testing.assert_close(row[1:1 + c].cpu(), mean, rtol=1e-13, atol=0)
    torch.testing.assert_close(row[1 + c:].cpu(), m2, rtol=1e-9, atol=0)
    m, i = kernels.batch_norm_stats(xd, EPS)
    close_stats(m, i, mean, 1 / torch.sqrt(m2 / (x.numel() // c) + EPS), torch.float32)
    dy = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype).contiguous(memory_format=fmt)
    s, sx, _, _ = kernels.batch_norm_backward_reduce(dy.to(DEV), xd, m, i, None, True, False, False)
    dy64, xmu = dy.double(), x64 - per_channel(m.double().cpu(), x)
    assert_close_u(s, dy64.sum(dims), torch.float32, scale=float(dy64.abs().sum(dims).max()))
    assert_close_u(sx, (dy64 * xmu).sum(dims), torch.float32, scale=float((dy64 * xmu).abs().sum(dims).max()))


@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last], ids=["contiguous", "channels_last"])
def test_misaligned_inputs_take_the_scalar_path(kernels, fmt):
    """Views whose data does not start on a 16-byte boundary: every op as on the CPU."""
    base = torch.randn(1 + 6 * 64 * 8 * 8, dtype=torch.float64).float() * 3 + 1
    x = base[1:].view(6, 64, 8, 8)
    if fmt == torch.channels_last:
        x = base[1:].view(6, 8, 8, 64).permute(0, 3, 1, 2)
    xd = torch.empty(x.numel() + 1, device=DEV)[1:].view(x.permute(0, 2, 3, 1).shape if fmt == torch.channels_last
                                                          else x.shape)
    xd = (xd.permute(0, 3, 1, 2) if fmt == torch.channels_last else xd)
    xd.copy_(x)
    assert xd.data_ptr() % 16 != 0 and xd.is_contiguous(memory_format=fmt)
    check_stats(kernels, x)
    got_m, got_i = kernels.batch_norm_stats(xd, EPS)
    want_m, want_i = kernels.batch_norm_stats(x, EPS)
    close_stats(got_m, got_i, want_m, want_i, torch.float32)
    out = kernels.batch_norm_elemt(xd, None, None, got_m, got_i, EPS)
    assert_close_u(out, kernels.batch_norm_elemt(x, None, None, want_m, want_i, EPS), torch.float32, scale=8.0,
                   units=8)
    g = kernels.batch_norm_backward_reduce(xd, xd, got_m, got_i, None, True, False, False)
    want = kernels.batch_norm_backward_reduce(x, x, want_m, want_i, None, True, False, False)
    assert_close_u(g[0], want[0], torch.float32, scale=float(x.abs().sum((0, 2, 3)).max()))


def test_per_channel_tensors_are_read_in_their_own_dtype(kernels):
    """mean/invstd/weight/bias/sums of any floating dtype, strided per-channel views: the results of the same
    values in float64."""
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(4, 6, 5, 7, generator=g, dtype=torch.float64) * 2 + 1).float().to(DEV)
    dy = torch.randn(4, 6, 5, 7, generator=g, dtype=torch.float64).float().to(DEV)
    mean, invstd = kernels.batch_norm_stats(x, EPS)
    w = torch.randn(12, generator=g, dtype=torch.float64).to(DEV)[::2]  # strided
    b = torch.randn(6, generator=g, dtype=torch.float64).to(DEV)
    s, sx, _, _ = kernels.batch_norm_backward_reduce(dy, x, mean, invstd, w, True, False, False)
    count = torch.tensor([x.numel() // 6], device=DEV)
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        def q(t, dtype=dtype):
            return t.to(dtype)

        def q64(t, dtype=dtype):
            return t.to(dtype).double()

        got = kernels.batch_norm_elemt(x, q(w), q(b), q(mean), q(invstd), EPS)
        want = kernels.batch_norm_elemt(x, q64(w), q64(b), q64(mean), q64(invstd), EPS)
        assert torch.equal(got, want), dtype
        got = kernels.batch_norm_backward_elemt(dy, x, q(mean), q(invstd), q(w), q(s), q(sx), count)
        want = kernels.batch_norm_backward_elemt(dy, x, q64(mean), q64(invstd), q64(w), q64(s), q64(sx), count)
        assert torch.equal(got, want), dtype
        gw = kernels.batch_norm_backward_reduce(dy, x, q(mean), q(invstd), q(w), True, True, True)
        assert gw[0].dtype == gw[1].dtype == dtype and gw[2].dtype == gw[3].dtype == dtype


def test_no_op_syncs_the_host(kernels):
    """Every op on CUDA tensors (and a CUDA count) runs with torch's sync debug mode set to error."""
    x = torch.randn(4, 8, 6, 5, device=DEV)
    xl = x.contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(8, device=DEV), torch.randn(8, device=DEV)
    count = torch.tensor([120], dtype=torch.int32, device=DEV)
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")  # a host sync in any op below raises RuntimeError
    outputs = []
    try:
        assert torch.cuda.get_sync_debug_mode() == 2
        for t in (x, xl, x[:0]):
            mean, invstd = kernels.batch_norm_stats(t, EPS)
            row = kernels.welford_stats(t)
            merged = kernels.welford_merge(torch.stack([row, row]))
            kernels.welford_finish(merged, torch.zeros(8, device=DEV), torch.ones(8, device=DEV), 0.1, EPS)
            kernels.batch_norm_gather_stats_with_counts(t, mean[None], invstd[None], torch.zeros(8, device=DEV),
                                                        torch.ones(8, device=DEV), 0.1, EPS,
                                                        torch.ones(1, device=DEV))
            kernels.batch_norm_elemt(t, w, b, mean, invstd, EPS)
            s, sx, _, _ = kernels.batch_norm_backward_reduce(t, t, mean, invstd, w, True, True, True)
            outputs.append(kernels.batch_norm_backward_elemt(t, t, mean, invstd, w, s, sx, count))
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    assert [tuple(o.shape) for o in outputs] == [tuple(x.shape), tuple(x.shape), (0, 8, 6, 5)]


@pytest.mark.skipif(torch.cuda.device_count() == 1, reason="needs a second GPU (results must stay on the input's GPU)")
def test_results_stay_on_the_inputs_gpu(kernels):
    x = torch.randn(4, 3, 5, 5, device="cuda:1")
    with torch.cuda.device(0):
        mean, invstd = kernels.batch_norm_stats(x, EPS)
        out = kernels.batch_norm_elemt(x, None, None, mean, invstd, EPS)
        row = kernels.welford_stats(x)
    assert {t.device for t in (mean, invstd, out, row)} == {torch.device("cuda:1")}
    want_mean, _ = ref_stats(x.cpu(), EPS)
    assert_close_u(mean, want_mean, torch.float32, scale=_scale(want_mean))


@pytest.mark.skipif(not hasattr(torch.library, "opcheck"), reason="torch.library.opcheck needs torch >= 2.4")
@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last], ids=["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["float32", "float16"])
@pytest.mark.parametrize("op,make", OPCHECK_CASES, ids=[f"{o}-{i}" for i, (o, _) in enumerate(OPCHECK_CASES)])
def test_opcheck(kernels, op, make, dtype, fmt):
    x = (torch.randn(4, 67, 3, 5) * 2 + 1).to(dtype).contiguous(memory_format=fmt)
    args = tuple(a.to(DEV) if isinstance(a, torch.Tensor) else a for a in make(x, kernels))
    result = torch.library.opcheck(getattr(kernels, op).default, args)
    assert all(v == "SUCCESS" for v in result.values()), result
