"""CUDA's arithmetic as the torch emulation runs it (:mod:`harness.impls.cuda_arith`), op by op, on adversarial inputs.

Design: every input below is built by a function of :data:`INPUTS` (CPU tensors, seeded). On CPU each op's result is
set against a plain transliteration of its CUDA loop written here, independently of the module: Python loops over
rows, threads and warps in float64, rounding to half, bfloat16 or the counts' dtype exactly where the kernel stores
into that type (``n + count`` in the gather, ``Float2``'s constructor in the contiguous backward_reduce). The
module accumulates in float32 where CUDA does, so the two agree to a few float32 roundings of the values' size,
and exactly on what decides a verdict: which rows poison the merge (NaN), which partials overflow half (inf),
what an empty input gives or raises. The ``cuda``-marked twins at the end run the same inputs through torch's
real CUDA ops and compare with the module on the CPU copies (tolerances stated there), so a GPU run checks the
emulation op by op.
"""

from __future__ import annotations

import pytest
import torch

from harness.impls import cuda_arith

H, B, F, D = torch.float16, torch.bfloat16, torch.float32, torch.float64
EPS = 1e-5
NAN = float("nan")


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def rnd(v: float, dtype) -> float:
    """v stored into ``dtype`` and read back (round to nearest even; past the range: inf)."""
    return float(torch.tensor(v, dtype=D).to(dtype))


# ------------------------------------------------------------------ inputs (shared with the cuda twins)

def gather_rows(w: int, c: int, seed: int = 0) -> tuple:
    g = gen(seed)
    return torch.randn(w, c, generator=g) + 1.0, 1 / (torch.rand(w, c, generator=g) + 0.5)


def gather_inputs() -> dict:
    """(mean, invstd, counts, running dtype): empty and NaN rows, counts past half's range, bfloat16 rounding."""
    out = {}
    mean, invstd = gather_rows(4, 6)
    zero = (mean.clone(), invstd.clone())
    zero[0][0], zero[1][0] = 0.0, 0.0  # an empty rank's zero row (torch's Python sends zeros), first
    out["zero-row-first"] = (*zero, torch.tensor([0.0, 5.0, 7.0, 3.0]), F)
    mid = (mean.clone(), invstd.clone())
    mid[0][2], mid[1][2] = 0.0, 0.0
    out["zero-row-middle"] = (*mid, torch.tensor([4.0, 5.0, 0.0, 3.0]), F)
    finite = (mean.clone(), invstd.clone())
    out["count-0-finite-row-middle"] = (*finite, torch.tensor([4.0, 5.0, 0.0, 3.0]), F)  # harmless: weight 0
    nanrow = (mean.clone(), invstd.clone())
    nanrow[0][1], nanrow[1][1] = NAN, NAN  # batch_norm_stats of an empty input on a channels-last path
    out["nan-row-count-0"] = (*nanrow, torch.tensor([4.0, 0.0, 6.0, 3.0]), F)
    m150, i150 = gather_rows(150, 4, seed=1)
    out["half-counts-past-65504"] = (m150, i150, torch.full((150,), 500.0), H)  # pytorch#70901's report
    m2, i2 = gather_rows(2, 5, seed=2)
    out["half-counts-50176x2"] = (m2, i2, torch.tensor([50176.0, 50176.0]), H)
    out["half-counts-40000-30000"] = (m2, i2, torch.tensor([40000.0, 30000.0]), H)
    out["bfloat16-counts-round"] = (torch.tensor([[1.0], [3.0]]), torch.ones(2, 1), torch.tensor([256.0, 1.0]), B)
    m3, i3 = gather_rows(3, 5, seed=3)
    out["double"] = (m3.double(), i3.double(), torch.tensor([1000.0, 1500.0, 750.0]), D)
    out["no-rows"] = (torch.zeros(0, 3), torch.zeros(0, 3), torch.zeros(0), F)
    return out


def act(shape, dtype, seed, offset=1.0, scale=2.0, fmt=torch.contiguous_format) -> torch.Tensor:
    x = offset + scale * torch.randn(shape, generator=gen(seed), dtype=D)
    return x.to(dtype).contiguous(memory_format=fmt) if len(shape) in (4, 5) else x.to(dtype)


def stats_inputs() -> dict:
    """Inputs of batch_norm_stats over both kernels' trees (16 warps; a channels-last grid of 16 blocks along R)."""
    cl = torch.channels_last
    return {
        "float32-contiguous": act((5, 3, 40, 7), F, 1),
        "float32-offset-100": act((8, 2, 600), F, 2, offset=100.0, scale=1.0),
        "float16-contiguous": act((4, 3, 9, 9), H, 3),
        "bfloat16-contiguous": act((4, 3, 9, 9), B, 4),
        "float64-contiguous": act((3, 4, 33), D, 5),
        "float32-channels_last-16-blocks": act((64, 8, 16, 16), F, 6, fmt=cl),
        "float16-channels_last": act((6, 5, 4, 3), H, 7, fmt=cl),
        "float32-2d": act((1000, 7), F, 8),
        "bfloat16-channels_last_3d": act((2, 3, 4, 3, 5), B, 9, fmt=torch.channels_last_3d),
    }


EMPTY = {"2d": ((0, 5), torch.contiguous_format), "4d-contiguous": ((0, 5, 4, 3), torch.contiguous_format),
         "4d-channels_last": ((0, 5, 4, 3), torch.channels_last)}


def empty(name: str, dtype=F) -> torch.Tensor:
    shape, fmt = EMPTY[name]
    t = torch.empty(shape, dtype=dtype)
    return t.contiguous(memory_format=fmt) if len(shape) == 4 else t


def grad_inputs() -> dict:
    """(grad_out, input, weight dtype) for the backward ops: half gradients scaled by 2**16 with a non-zero mean (the
    contiguous kernel's half partials overflow, pytorch#195701), bfloat16, channels_last, a 3-D input."""
    cl = torch.channels_last
    scaled = act((64, 2, 256), D, 10, offset=1.0, scale=0.05) * 2.0**16 / 1024  # ~64 each: partials pass 65,504
    return {
        "float16-scaled-2**16-contiguous": (scaled.to(H), act((64, 2, 256), H, 11), F),
        "float16-scaled-2**16-channels_last": (scaled.reshape(64, 2, 16, 16).to(H).contiguous(memory_format=cl),
                                                act((64, 2, 16, 16), H, 11, fmt=cl), F),
        "bfloat16-contiguous": (act((8, 3, 70), B, 12, offset=0.5), act((8, 3, 70), B, 13), F),
        "float16-half-weight": (act((4, 3, 5, 5), H, 14, offset=0.2), act((4, 3, 5, 5), H, 15), H),
        "float32-channels_last": (act((6, 5, 4, 3), F, 16, fmt=cl), act((6, 5, 4, 3), F, 17, fmt=cl), F),
        "float32-channels_last-16-blocks": (act((64, 8, 16, 16), F, 18, offset=0.1, fmt=cl),
                                            act((64, 8, 16, 16), F, 19, fmt=cl), F),
        "float64-contiguous": (act((3, 4, 33), D, 20), act((3, 4, 33), D, 21), D),
    }


def params(c: int, dtype, seed: int) -> tuple:
    g = gen(seed)
    return (torch.randn(c, generator=g, dtype=D) * 0.5 + 1).to(dtype), torch.randn(c, generator=g, dtype=D).to(dtype)


def stats_for(x: torch.Tensor) -> tuple:
    """Float64 mean and invstd of ``x`` per channel, in its acc dtype (what the forward saved)."""
    acc = D if x.dtype == D else F
    xd = x.double().transpose(0, 1).reshape(x.shape[1], -1)
    return xd.mean(1).to(acc), (1 / torch.sqrt(xd.var(1, unbiased=False) + EPS)).to(acc)


# ------------------------------------------------------------------ plain transliterations (float64 loops)

def gather_loop(mean, invstd, counts, eps, sdt):
    """batch_norm_reduce_statistics_kernel, one channel at a time, in float64 scalars (IEEE: 1/0 is inf, 0 * inf
    NaN): the running count an int, n + count stored in the counts' dtype, n += count added in float (double for
    double counts) and truncated, saturating."""
    def f(v):
        return torch.tensor(float(v), dtype=D)

    means, invs = [], []
    for ch in range(mean.shape[1]):
        avg, var_n, n = f(0), f(0), 0
        for j in range(mean.shape[0]):
            cnt = f(rnd(float(counts[j]), sdt))
            m = f(mean[j, ch])
            v = 1 / f(invstd[j, ch])
            v = (v * v - eps) * cnt
            factor = 1 / f(rnd(rnd(float(n), sdt) + float(cnt), sdt))
            var_n = var_n + (v + (avg - m) * (avg - m) * n * cnt * factor)
            avg = n * factor * avg + cnt * factor * m
            total = float(n) + float(cnt) if sdt == D else rnd(float(n) + float(cnt), F)
            n = 0 if total != total else int(max(-2.0**31, min(2.0**31 - 1, total)))
        means.append(float(avg))
        invs.append(float(1 / torch.sqrt(var_n / n + eps)) if n else float(1 / torch.sqrt(var_n / f(0) + eps)))
    return torch.tensor(means, dtype=D), torch.tensor(invs, dtype=D)


def backward_reduce_loop(g, x, mean, narrow):
    """batch_norm_backward_reduce_kernel on [N, C, L], one channel at a time: thread (tx, ty) sums rows ty, ty + by,
    ... and features tx, tx + bx, ...; each term, and each partial a warp shuffle moves, stored as ``narrow``."""
    n, c, ln = x.shape
    by = 1
    while by * 2 <= min(n, 16):
        by *= 2
    bx = next(t for t in (32, 64, 128, 256, 512) if ln <= t or t == 512)
    bx = min(bx, 512 // by)
    keep = (lambda v: rnd(v, narrow)) if narrow else (lambda v: v)

    def warp(vals):
        vals = list(vals) + [(0.0, 0.0)] * (32 - len(vals))
        for o in (16, 8, 4, 2, 1):
            for i in range(o):
                vals[i] = (vals[i][0] + keep(vals[i + o][0]), vals[i][1] + keep(vals[i + o][1]))
        return vals[0]

    out = []
    gl, xl = g.double().tolist(), x.double().tolist()
    for ch in range(c):
        mu = float(mean[ch])
        threads = []
        for ty in range(by):
            for tx in range(bx):
                s1 = s2 = 0.0
                for b in range(ty, n, by):
                    for f in range(tx, ln, bx):
                        gv, xv = gl[b][ch][f], xl[b][ch][f]
                        s1 += keep(gv)
                        s2 += keep(gv * (xv - mu))
                threads.append((s1, s2))
        leads = [warp(threads[w:w + 32]) for w in range(0, len(threads), 32)]
        out.append(warp(leads))
    return torch.tensor([o[0] for o in out], dtype=D), torch.tensor([o[1] for o in out], dtype=D)


def close(got, want, rtol, what="", size=None):
    """Equal where non-finite (same NaN and inf positions); elsewhere within rtol of ``size`` (per element: the sum
    of the terms' magnitudes, for a sum whose terms cancel), else of the largest magnitude."""
    got, want = got.double(), want.double()
    assert torch.equal(got.isnan(), want.isnan()), f"{what}: NaN at {got.isnan().tolist()}, want {want.isnan()}"
    assert torch.equal(got.isinf(), want.isinf()) and torch.equal(got[got.isinf()], want[want.isinf()]), \
        f"{what}: {got.tolist()}, want {want.tolist()}"
    fin = want.isfinite()
    if fin.any():
        scale = size.double()[fin] if size is not None else float(want[fin].abs().max()) + 1e-30
        err = (got[fin] - want[fin]).abs()
        assert bool((err <= rtol * scale).all()), f"{what}: error {float((err / (rtol * scale)).max()):.3g} x bound"


ULP = {H: 2.0**-10, B: 2.0**-7, F: 2.0**-23, D: 2.0**-52}  # spacing at 1


def acc_of(dtype) -> torch.dtype:
    return D if dtype == D else F


def contiguous_path(x: torch.Tensor) -> bool:
    """Whether the reductions take their contiguous kernel (CUDA's batch_norm_use_channels_last_kernels, negated)."""
    cl = (x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last)) or \
        (x.dim() == 5 and x.is_contiguous(memory_format=torch.channels_last_3d)) or \
        (x.is_contiguous() and x.stride(1) == 1)
    return not cl


def elemt_want(x, w, b, mean, invstd):
    shape = (1, -1) + (1,) * (x.dim() - 2)
    return (x.double() - mean.double().reshape(shape)) * invstd.double().reshape(shape) * w.double().reshape(shape) \
        + b.double().reshape(shape)


def backward_elemt_want(g, x, mean, invstd, w, sum_dy, sum_dy_xmu, total):
    shape = (1, -1) + (1,) * (x.dim() - 2)
    inv, md = invstd.double().reshape(shape), mean.double().reshape(shape)
    f1 = inv * inv * sum_dy_xmu.double().reshape(shape) / total
    parts = (g.double(), sum_dy.double().reshape(shape) / total, (x.double() - md) * f1)
    f2 = w.double().reshape(shape) * inv
    return (parts[0] - parts[1] - parts[2]) * f2, (parts[0].abs() + parts[1].abs() + parts[2].abs()) * f2.abs()


def within(got, want, size, dtype, what=""):
    """|got - want| <= 4 ulps of ``dtype`` (and of float32, the arithmetic's) times the size of the terms."""
    bound = 4 * (ULP[dtype] + ULP[F if dtype != D else D]) * (size + 1e-30)
    err = (got.double() - want).abs()
    assert bool((err <= bound).all()), f"{what}: error {float((err / bound).max()):.3g} x the bound"


def backward_elemt_args(g, x, wdt):
    """What torch's Function hands backward_elemt: forward statistics, the weight in their dtype, reductions summed
    over 2 ranks (this one twice), the int32 counts; the sums in float64 here."""
    mean, invstd = stats_for(x)
    w, _ = params(x.shape[1], wdt, 5)
    gd, xd = g.double().transpose(0, 1).reshape(x.shape[1], -1), x.double().transpose(0, 1).reshape(x.shape[1], -1)
    sum_dy = (2 * gd.sum(1)).to(mean.dtype)
    sum_dy_xmu = (2 * (gd * (xd - mean.double()[:, None])).sum(1)).to(mean.dtype)
    count = torch.tensor([[x.numel() // x.shape[1]]] * 2, dtype=torch.int32)
    return mean, invstd, w.to(mean.dtype), sum_dy, sum_dy_xmu, count  # the weight cast of pytorch#98332


# ------------------------------------------------------------------ on CPU, against the loops

@pytest.mark.parametrize("name", sorted(gather_inputs()))
def test_the_gather_merges_every_row_as_cudas_loop(name):
    mean, invstd, counts, sdt = gather_inputs()[name]
    c, acc = mean.shape[1], acc_of(sdt)
    got = cuda_arith.batch_norm_gather_stats_with_counts(torch.empty(1, c, dtype=sdt), mean.to(acc), invstd.to(acc),
                                                         None, None, 0.1, EPS, counts.to(sdt))
    want = gather_loop(mean, invstd, counts, EPS, sdt)
    for g, w, what in zip(got, want, ("mean", "invstd")):
        assert g.dtype == acc
        close(g, w, 1e-12 if sdt == D else 2e-5, f"{name} {what}")


def test_zero_count_rows_poison_the_merge_as_on_cuda():
    """What pytorch#78656 is about: a zero row (an empty rank's) in the gather is NaN wherever it sits; a count-0 row
    with finite statistics after the first adds nothing; NaN statistics poison whatever their count."""
    rows = gather_inputs()
    # Which of the two is NaN: a zero invstd is an infinite variance, and inf x count 0 is NaN, so invstd is NaN
    # wherever the zero row sits; the mean is NaN when the zero row comes first (its count 0 leaves a running
    # count of 0, and the weight 0 / 0 is NaN) or when the row's statistics are NaN themselves, and finite when
    # a zero row comes later (its weight is 0).
    for name, mean_nan in (("zero-row-first", True), ("zero-row-middle", False), ("nan-row-count-0", True)):
        mean, invstd, counts, sdt = rows[name]
        got = cuda_arith.batch_norm_gather_stats_with_counts(torch.empty(1, 6), mean, invstd, None, None, 0.1, EPS,
                                                             counts)
        assert bool(got[1].isnan().all()), (name, got[1])
        assert bool(got[0].isnan().all() if mean_nan else got[0].isfinite().all()), (name, got[0])
    mean, invstd, counts, _ = rows["count-0-finite-row-middle"]
    keep = torch.tensor([0, 1, 3])
    with_row = cuda_arith.batch_norm_gather_stats_with_counts(torch.empty(1, 6), mean, invstd, None, None, 0.1, EPS,
                                                              counts)
    without = cuda_arith.batch_norm_gather_stats_with_counts(torch.empty(1, 6), mean[keep], invstd[keep], None, None,
                                                             0.1, EPS, counts[keep])
    close(with_row[0], without[0], 1e-6, "mean")
    close(with_row[1], without[1], 1e-6, "invstd")


def test_half_counts_past_65504_give_a_zero_mean_and_no_rows_shrink_the_running_statistics():
    mean, invstd, counts, _ = gather_inputs()["half-counts-past-65504"]  # pytorch#70901's report
    rm, rv = torch.rand(4).half(), torch.rand(4).half() + 1e-4
    got, _ = cuda_arith.batch_norm_gather_stats_with_counts(torch.empty(1, 4, dtype=H), mean, invstd, rm, rv, 0.1,
                                                            1e-3, counts.half())
    assert torch.equal(got, torch.zeros(4))
    rm, rv = torch.full((3,), 2.0), torch.full((3,), 4.0)  # every rank empty: no rows reach the kernel
    got_m, got_i = cuda_arith.batch_norm_gather_stats_with_counts(torch.empty(0, 3), torch.zeros(0, 3),
                                                                  torch.zeros(0, 3), rm, rv, 0.1, EPS, torch.zeros(0))
    assert torch.equal(got_m, torch.zeros(3)) and bool(got_i.isnan().all())
    torch.testing.assert_close(rm, torch.full((3,), 1.8))
    torch.testing.assert_close(rv, torch.full((3,), 3.6))  # 0.9 * 4 + 0.1 * (0 / -1)


def test_bfloat16_counts_round_the_running_count():
    """n + count = 257 rounds to 256 in bfloat16: the second row gets weight 1/256, the first 256/256."""
    mean, invstd, counts, _ = gather_inputs()["bfloat16-counts-round"]
    got, _ = cuda_arith.batch_norm_gather_stats_with_counts(torch.empty(1, 1, dtype=B), mean, invstd, None, None, 0.1,
                                                            0.0, counts.bfloat16())
    assert got.item() == pytest.approx(1.0 + 3.0 / 256, rel=1e-6)


@pytest.mark.parametrize("name", sorted(stats_inputs()))
def test_stats_are_the_mean_and_invstd_in_acc(name):
    x = stats_inputs()[name]
    mean, invstd = cuda_arith.batch_norm_stats(x, EPS)
    want_mean, want_invstd = (t.double() for t in stats_for(x.double()))
    assert mean.dtype == invstd.dtype == acc_of(x.dtype)
    rtol = 1e-12 if x.dtype == D else (1e-4 if "offset" in name else 1e-5)
    close(mean, want_mean, rtol, "mean")
    close(invstd, want_invstd, rtol, "invstd")


def test_stats_of_an_empty_input_are_zero_and_nan_or_the_reshape_error():
    for name in ("2d", "4d-channels_last"):  # the channels-last kernel: count 0, so 0 / 0
        mean, invstd = cuda_arith.batch_norm_stats(empty(name), EPS)
        assert torch.equal(mean, torch.zeros(5)) and bool(invstd.isnan().all()), name
    with pytest.raises(RuntimeError, match="cannot reshape tensor of 0 elements"):
        cuda_arith.batch_norm_stats(empty("4d-contiguous"), EPS)


def elemt_inputs() -> dict:
    out = dict(stats_inputs())
    out["float32-permuted"] = act((3, 4, 5, 6), F, 30).permute(0, 1, 3, 2)  # neither layout: the TensorIterator
    out["float16-strided-channels"] = act((4, 6, 5), H, 31)[:, ::2]
    return out


@pytest.mark.parametrize("name", sorted(elemt_inputs()))
def test_elemt_normalizes_in_acc_and_keeps_the_layout(name):
    x = elemt_inputs()[name]
    mean, invstd = stats_for(x)
    w, b = params(x.shape[1], mean.dtype, 1)
    y = cuda_arith.batch_norm_elemt(x, w, b, mean, invstd)
    assert y.dtype == x.dtype and y.stride() == torch.empty_like(x).stride()
    want = elemt_want(x, w, b, mean, invstd)
    within(y, want, want.abs().amax() + b.double().abs().max(), x.dtype, name)


def test_elemt_of_an_empty_input_raises_as_cuda():
    with pytest.raises(RuntimeError, match="cannot reshape tensor of 0 elements"):
        cuda_arith.batch_norm_elemt(empty("4d-contiguous"), None, None, torch.zeros(5), torch.ones(5))
    for name in ("2d", "4d-channels_last"):  # a channels-last launch with a grid of height 0
        with pytest.raises(RuntimeError, match="CUDA error: invalid argument"):
            cuda_arith.batch_norm_elemt(empty(name), None, None, torch.zeros(5), torch.ones(5))


@pytest.mark.slow(4)
@pytest.mark.parametrize("name", sorted(grad_inputs()))
def test_backward_reduce_sums_as_cudas_kernel(name):
    g, x, wdt = grad_inputs()[name]
    mean, invstd = stats_for(x)
    w, _ = params(x.shape[1], wdt, 2)
    sdy, sxmu, gw, gb = cuda_arith.batch_norm_backward_reduce(g, x, mean, invstd, w, True, True, True)
    assert sdy.dtype == sxmu.dtype == mean.dtype and gw.dtype == gb.dtype == w.dtype
    if contiguous_path(x):
        narrow = x.dtype if x.dtype in (H, B) else None
        x3 = x.reshape(x.shape[0], x.shape[1], -1)
        want = backward_reduce_loop(g.reshape(x3.shape), x3, mean, narrow)
    else:
        gd, xd = g.double().transpose(0, 1).reshape(x.shape[1], -1), x.double().transpose(0, 1).reshape(x.shape[1], -1)
        want = gd.sum(1), (gd * (xd - mean.double()[:, None])).sum(1)
    gd, xd = g.double().transpose(0, 1).reshape(x.shape[1], -1), x.double().transpose(0, 1).reshape(x.shape[1], -1)
    sizes = gd.abs().sum(1), (gd * (xd - mean.double()[:, None])).abs().sum(1)  # the terms' magnitudes
    narrowed = contiguous_path(x) and x.dtype in (H, B)
    rtol = {H: 2.0**-9, B: 2.0**-6}[x.dtype] if narrowed else (2.0**-45 if x.dtype == D else 2.0**-18)
    close(sdy, want[0], rtol, "sum_dy", sizes[0])
    close(sxmu, want[1], rtol, "sum_dy_xmu", sizes[1])
    close(gb, want[0].to(wdt), rtol + ULP[wdt], "grad_bias", sizes[0])
    close(gw, (want[1] * invstd.double()).to(wdt), rtol + ULP[wdt], "grad_weight", sizes[1] * invstd.double())


def test_half_partials_overflow_in_the_contiguous_backward_reduce_only():
    """pytorch#195701: gradients scaled by 2**16 with a non-zero mean; the contiguous kernel's half partials pass
    65,504 (sum_dy inf), the channels-last kernel's float ones do not; releases with pytorch#196125 keep float."""
    inputs = grad_inputs()
    for name, overflows in (("float16-scaled-2**16-contiguous", True), ("float16-scaled-2**16-channels_last", False)):
        g, x, _ = inputs[name]
        mean, invstd = stats_for(x)
        sdy = cuda_arith.batch_norm_backward_reduce(g, x, mean, invstd, None, True, False, False)[0]
        assert bool(sdy.isinf().all()) == overflows and (overflows or bool(sdy.isfinite().all())), name
    assert cuda_arith.float2_narrows("2.11.0+cu130") and cuda_arith.float2_narrows("1.13.1")
    assert not cuda_arith.float2_narrows("2.15.0") and not cuda_arith.float2_narrows("2.16.0.dev20270101")


def test_backward_reduce_of_an_empty_input():
    with pytest.raises(RuntimeError, match="cannot reshape tensor of 0 elements"):
        x = empty("4d-contiguous")
        cuda_arith.batch_norm_backward_reduce(x, x, torch.zeros(5), torch.ones(5), None, True, False, False)
    for name in ("2d", "4d-channels_last"):  # every thread of the channels-last kernel returns before writing
        x = empty(name)
        out = cuda_arith.batch_norm_backward_reduce(x, x, torch.zeros(5), torch.ones(5), torch.ones(5), True, True,
                                                    True)
        assert [tuple(t.shape) for t in out] == [(5,)] * 4 and all(t.dtype == F for t in out)


@pytest.mark.parametrize("name", sorted(grad_inputs()))
def test_backward_elemt_in_acc(name):
    g, x, wdt = grad_inputs()[name]
    mean, invstd, w, sum_dy, sum_dy_xmu, count = backward_elemt_args(g, x, wdt)
    got = cuda_arith.batch_norm_backward_elemt(g, x, mean, invstd, w, sum_dy, sum_dy_xmu, count)
    assert got.dtype == x.dtype
    assert got.is_contiguous() if contiguous_path(x) else got.stride() == x.stride()
    want, size = backward_elemt_want(g, x, mean, invstd, w, sum_dy, sum_dy_xmu, 2 * (x.numel() // x.shape[1]))
    within(got, want, size, x.dtype, name)


def test_backward_elemt_channels_last_reads_a_strided_weight_by_pointer():
    """Its channels-last kernel does not check the weight's strides: w[::2] is read as the first C values."""
    g, x, _ = grad_inputs()["float32-channels_last"]
    mean, invstd, w, sum_dy, sum_dy_xmu, count = backward_elemt_args(g, x, F)
    base = torch.arange(10, dtype=F) / 10 + 0.5
    got = cuda_arith.batch_norm_backward_elemt(g, x, mean, invstd, base[::2], sum_dy, sum_dy_xmu, count)
    want = cuda_arith.batch_norm_backward_elemt(g, x, mean, invstd, base[:5].clone(), sum_dy, sum_dy_xmu, count)
    assert torch.equal(got, want)
    contiguous = x.contiguous()  # the contiguous kernel's accessor honours strides
    got = cuda_arith.batch_norm_backward_elemt(g.contiguous(), contiguous, mean, invstd, base[::2], sum_dy,
                                               sum_dy_xmu, count)
    assert torch.equal(got, cuda_arith.batch_norm_backward_elemt(g.contiguous(), contiguous, mean, invstd,
                                                                 base[::2].clone(), sum_dy, sum_dy_xmu, count))


def test_backward_elemt_of_an_empty_input_raises_as_cuda():
    z, o, cnt = torch.zeros(5), torch.ones(5), torch.zeros(1, 1, dtype=torch.int32)
    x = empty("4d-contiguous")
    with pytest.raises(RuntimeError, match="cannot reshape tensor of 0 elements"):
        cuda_arith.batch_norm_backward_elemt(x, x, z, o, None, z, z, cnt)
    for name in ("2d", "4d-channels_last"):
        x = empty(name)
        with pytest.raises(RuntimeError, match="CUDA error: invalid argument"):
            cuda_arith.batch_norm_backward_elemt(x, x, z, o, None, z, z, cnt)


# ------------------------------------------------------------------ on a GPU: torch's real kernels against the module
# The same inputs through torch.batch_norm_* on cuda tensors, against cuda_arith on the CPU copies. Tolerances:
# statistics and float sums within 1e-5 of their scale (nvcc's fused multiply-adds and merge order move a few float
# roundings; 1e-4 for invstd at a 100x offset); half and bfloat16 partials within 2**-9 and 2**-6 of the terms'
# magnitudes (a rounding to the narrow type can fall either side); elementwise outputs within 4 ulps of their
# dtype; NaN and inf at the same places; empty inputs raise the same error or return the same shapes. Inputs are
# fixed and the kernels deterministic: a failure is a difference, not noise. About 5 s on an H200.

gpu = pytest.mark.cuda


def cuda(t):
    return None if t is None else t.cuda()


def same_outcome(emulated, real, what):
    """Run both; either both raise, the same first line, or both return."""
    outcomes = []
    for f in (emulated, real):
        try:
            out = f()
            if isinstance(out, torch.Tensor) or (isinstance(out, tuple) and out and out[0] is not None):
                torch.cuda.synchronize()
            outcomes.append(("ok", out))
        except RuntimeError as e:
            outcomes.append(("raise", str(e).splitlines()[0]))
    assert [o[0] for o in outcomes][0] == outcomes[1][0], f"{what}: emulation {outcomes[0]}, CUDA {outcomes[1]}"
    if outcomes[0][0] == "raise":
        assert outcomes[0][1] == outcomes[1][1], what
    return outcomes[0][1], outcomes[1][1]


@gpu
def test_cuda_gather_matches_the_emulation():
    for name, (mean, invstd, counts, sdt) in gather_inputs().items():
        c, acc = mean.shape[1], acc_of(sdt)
        rm, rv = torch.linspace(-1, 1, c).to(sdt), torch.linspace(0.5, 2, c).to(sdt)
        crm, crv = rm.cuda(), rv.cuda()
        args = (mean.to(acc), invstd.to(acc))
        want = cuda_arith.batch_norm_gather_stats_with_counts(torch.empty(1, c, dtype=sdt), *args, rm, rv, 0.1, EPS,
                                                              counts.to(sdt))
        got = torch.batch_norm_gather_stats_with_counts(torch.empty(1, c, dtype=sdt).cuda(),
                                                        *(cuda(t) for t in args), crm, crv, 0.1, EPS,
                                                        counts.to(sdt).cuda())
        rtol = 1e-12 if sdt == D else 1e-5
        for g, w, what in zip(got, want, ("mean", "invstd")):
            assert g.dtype == w.dtype, name
            close(g.cpu(), w, rtol, f"{name} {what}")
        close(crm.cpu(), rm, rtol + ULP[sdt], f"{name} running_mean")
        close(crv.cpu(), rv, rtol + ULP[sdt], f"{name} running_var")


@gpu
def test_cuda_stats_match_the_emulation():
    for name, x in stats_inputs().items():
        want = cuda_arith.batch_norm_stats(x, EPS)
        got = torch.batch_norm_stats(x.cuda(), EPS)
        assert got[0].dtype == want[0].dtype and got[0].shape == want[0].shape, name
        rtol = 1e-12 if x.dtype == D else 1e-5
        spread = float((1 / want[1].double()).max())
        close(got[0].cpu(), want[0], rtol, f"{name} mean", torch.full_like(want[0].double(), spread) +
              want[0].double().abs())
        close(got[1].cpu(), want[1], rtol * (10 if "offset" in name else 1), f"{name} invstd", want[1].double().abs())
    for name in EMPTY:
        x = empty(name)
        emulated, real = same_outcome(lambda x=x: cuda_arith.batch_norm_stats(x, EPS),
                                      lambda x=x: torch.batch_norm_stats(x.cuda(), EPS), f"empty {name}")
        if isinstance(real, tuple):
            for g, w in zip(real, emulated):
                close(g.cpu(), w, 0.0, f"empty {name}")


@gpu
def test_cuda_elemt_matches_the_emulation():
    for name, x in elemt_inputs().items():
        mean, invstd = stats_for(x)
        w, b = params(x.shape[1], mean.dtype, 1)
        want = cuda_arith.batch_norm_elemt(x, w, b, mean, invstd)
        got = torch.batch_norm_elemt(x.cuda(), cuda(w), cuda(b), mean.cuda(), invstd.cuda(), EPS)
        assert got.dtype == want.dtype and got.stride() == want.stride(), name
        close(got.cpu(), want, 4 * ULP[x.dtype], name)
    z, o = torch.zeros(5), torch.ones(5)
    for name in EMPTY:
        x = empty(name)
        same_outcome(lambda x=x: cuda_arith.batch_norm_elemt(x, None, None, z, o),
                     lambda x=x: torch.batch_norm_elemt(x.cuda(), None, None, z.cuda(), o.cuda(), EPS), f"empty {name}")


@gpu
def test_cuda_backward_reduce_matches_the_emulation():
    for name, (g, x, wdt) in grad_inputs().items():
        mean, invstd = stats_for(x)
        w, _ = params(x.shape[1], wdt, 2)
        want = cuda_arith.batch_norm_backward_reduce(g, x, mean, invstd, w, True, True, True)
        got = torch.batch_norm_backward_reduce(g.cuda(), x.cuda(), mean.cuda(), invstd.cuda(), w.cuda(), True, True,
                                               True)
        gd = g.double().transpose(0, 1).reshape(x.shape[1], -1)
        xd = x.double().transpose(0, 1).reshape(x.shape[1], -1)
        sizes = gd.abs().sum(1), (gd * (xd - mean.double()[:, None])).abs().sum(1)
        narrowed = contiguous_path(x) and x.dtype in (H, B)
        rtol = {H: 2.0**-9, B: 2.0**-6}[x.dtype] if narrowed else (1e-12 if x.dtype == D else 1e-5)
        for k, what in enumerate(("sum_dy", "sum_dy_xmu", "grad_weight", "grad_bias")):
            size = sizes[1] * invstd.double() if k == 2 else sizes[k % 2 if k < 2 else 0]
            assert got[k].dtype == want[k].dtype, f"{name} {what}"
            close(got[k].cpu(), want[k], rtol + (ULP[wdt] if k > 1 else 0), f"{name} {what}", size)
    z, o = torch.zeros(5), torch.ones(5)
    for name in EMPTY:
        x = empty(name)
        emulated, real = same_outcome(
            lambda x=x: cuda_arith.batch_norm_backward_reduce(x, x, z, o, o, True, True, True),
            lambda x=x: torch.batch_norm_backward_reduce(x.cuda(), x.cuda(), z.cuda(), o.cuda(), o.cuda(), True, True,
                                                     True), f"empty {name}")
        if isinstance(real, tuple):  # nothing written: compare what was allocated, not its contents
            assert [(t.shape, t.dtype) for t in real] == [(t.shape, t.dtype) for t in emulated], name


@gpu
def test_cuda_backward_elemt_matches_the_emulation():
    for name, (g, x, wdt) in grad_inputs().items():
        mean, invstd, w, sum_dy, sum_dy_xmu, count = backward_elemt_args(g, x, wdt)
        want = cuda_arith.batch_norm_backward_elemt(g, x, mean, invstd, w, sum_dy, sum_dy_xmu, count)
        got = torch.batch_norm_backward_elemt(*(cuda(t) for t in (g, x, mean, invstd, w, sum_dy, sum_dy_xmu, count)))
        assert got.dtype == want.dtype and got.stride() == want.stride(), name
        _, size = backward_elemt_want(g, x, mean, invstd, w, sum_dy, sum_dy_xmu, 2 * (x.numel() // x.shape[1]))
        within(got.cpu(), want.double(), size, x.dtype, name)
    g, x, _ = grad_inputs()["float32-channels_last"]  # a strided weight, read by pointer
    mean, invstd, w, sum_dy, sum_dy_xmu, count = backward_elemt_args(g, x, F)
    base = torch.arange(10, dtype=F) / 10 + 0.5
    want = cuda_arith.batch_norm_backward_elemt(g, x, mean, invstd, base[::2], sum_dy, sum_dy_xmu, count)
    got = torch.batch_norm_backward_elemt(g.cuda(), x.cuda(), mean.cuda(), invstd.cuda(), base.cuda()[::2],
                                          sum_dy.cuda(), sum_dy_xmu.cuda(), count.cuda())
    close(got.cpu(), want, 4 * ULP[F], "strided weight")
    z, o, cnt = torch.zeros(5), torch.ones(5), torch.zeros(1, 1, dtype=torch.int32)
    for name in EMPTY:
        x = empty(name)
        same_outcome(lambda x=x: cuda_arith.batch_norm_backward_elemt(x, x, z, o, None, z, z, cnt),
                     lambda x=x: torch.batch_norm_backward_elemt(x.cuda(), x.cuda(), z.cuda(), o.cuda(), None, z.cuda(),
                                                             z.cuda(), cnt.cuda()), f"empty {name}")
