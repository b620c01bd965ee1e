"""The private ops' float64 contract (harness/judge/private_ops.py) from both sides, in one process.

Each op is computed here in plain torch, independently of the module and of the harness's kernels: in float64, and
in float32 as CUDA's kernels accumulate (half and bfloat16 inputs stored as such). Those must pass on every output.
Then one defect at a time of the kinds these ops shipped or could ship (a variance returned for invstd, a count-0
row given weight, counts summed in half, a biased running variance, partial sums in half, the world size for the
count, a lost dtype or layout) must fail on the output it corrupts, and only there.
"""

from __future__ import annotations

import math

import pytest
import torch

from harness.judge import private_ops as contract

EPS = 1e-5
F, H, B, D = torch.float32, torch.float16, torch.bfloat16, torch.float64


def _dims(x):
    return [0] + list(range(2, x.dim()))


def _ch(v, x):
    return v.reshape(1, -1, *([1] * (x.dim() - 2)))


def activations(dtype, seed, shape=(5, 6, 4, 3), offset=3.0, scale=2.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (offset + scale * torch.randn(shape, generator=g, dtype=D)).to(dtype)


def stats(x, acc, defect=""):
    var, mean = torch.var_mean(x.to(acc), _dims(x), unbiased=False)
    invstd = torch.rsqrt(var + EPS)
    if defect == "variance-for-invstd":
        invstd = var
    return mean, invstd


def rows(dtype=F, seed=1, counts=(15.0, 25.0, 40.0)):
    xs = [activations(dtype, seed + i, shape=(int(n) // 12, 6, 4, 3)) for i, n in enumerate(counts)]
    ms, invs = zip(*(stats(x, F) for x in xs))
    return torch.stack(ms), torch.stack(invs), torch.tensor(counts)


def gather(mean, invstd, counts, rm, rv, momentum, acc, defect=""):
    c = counts.to(acc)[:, None]
    if defect == "equal-weights":
        c = torch.ones_like(c)
    keep = (c > 0) if defect != "zero-row-weighted" else torch.ones_like(c, dtype=torch.bool)
    m, inv = mean.to(acc), invstd.to(acc)
    n = c.sum(0) if defect != "half-count-sum" else torch.full_like(c[0], math.inf)
    v = torch.where(keep, c * (1 / (inv * inv) - EPS), torch.zeros_like(m))
    if defect == "zero-row-weighted":
        v = c * (1 / (inv * inv) - EPS)  # 0 * inf: NaN
    mu = (torch.where(keep, c * m, torch.zeros_like(m))).sum(0) / n
    var = (v + torch.where(keep, c * (m - mu) ** 2, torch.zeros_like(m))).sum(0) / n
    out_inv = torch.rsqrt(var + EPS)
    unbiased = var if defect == "biased-running-var" else var * n / (n - 1)
    rm.copy_(((1 - momentum) * rm.to(acc) + momentum * mu).to(rm.dtype))
    rv.copy_(((1 - momentum) * rv.to(acc) + momentum * unbiased).to(rv.dtype))
    if defect == "variance-for-invstd":
        out_inv = var
    return mu, out_inv


def elemt(x, w, b, mean, invstd, acc, defect=""):
    y = (x.to(acc) - _ch(mean.to(acc), x)) * _ch(invstd.to(acc), x) * _ch(w.to(acc), x) + _ch(b.to(acc), x)
    if defect == "output-in-acc":
        return y
    out = torch.empty_like(x) if defect != "layout-lost" else torch.empty(x.shape, dtype=x.dtype)
    return out.copy_(y)


def backward_reduce(g, x, mean, invstd, w, acc, defect=""):
    gd = g.to(acc)
    xmu = x.to(acc) if defect == "mean-not-subtracted" else x.to(acc) - _ch(mean.to(acc), x)
    if defect == "half-partials":
        gd = gd * 2.0**16  # what a partial past 65,504 makes of a half sum: inf
        sum_dy = gd.to(H).sum(_dims(x), dtype=H).to(acc) / 2.0**16
    else:
        sum_dy = gd.sum(_dims(x))
    sum_dy_xmu = (gd * xmu).sum(_dims(x)) / (2.0**16 if defect == "half-partials" else 1.0)
    return (sum_dy.to(mean.dtype), sum_dy_xmu.to(mean.dtype), (sum_dy_xmu * invstd.to(acc)).to(w.dtype),
            sum_dy.to(w.dtype))


def backward_elemt(g, x, mean, invstd, w, sum_dy, sum_dy_xmu, count, acc, defect=""):
    n = float(count.sum()) if defect != "world-size-for-count" else float(count.numel())
    inv = _ch(invstd.to(acc), x)
    dx = (g.to(acc) - _ch(sum_dy.to(acc), x) / n
          - (x.to(acc) - _ch(mean.to(acc), x)) * inv * inv * _ch(sum_dy_xmu.to(acc), x) / n) * _ch(w.to(acc), x) * inv
    return torch.empty_like(x).copy_(dx)


def failing(metrics) -> set:
    return {name.split(".", 1)[1] for name, m in metrics if not m.ok}


def judged_stats(x, acc, defect=""):
    mean, invstd = stats(x, acc, defect)
    return failing(contract.judge("batch_norm_stats", contract.stats(x, EPS), {"mean": mean, "invstd": invstd}))


@pytest.mark.parametrize("dtype", [F, H, B, D])
def test_stats_pass_in_float64_and_in_cudas_accumulation_and_fail_a_variance_for_invstd(dtype):
    x = activations(dtype, 0)
    assert judged_stats(x, contract.acc(dtype)) == set()
    assert judged_stats(x, D) == set() if dtype == D else judged_stats(x, D) == {"mean", "invstd"}  # dtype: acc
    assert judged_stats(x, contract.acc(dtype), "variance-for-invstd") == {"invstd"}


def test_an_empty_input_gives_a_zero_mean_and_nan_invstd_nothing_else():
    x = torch.empty(0, 6)
    want = contract.stats(x, EPS)
    nan = torch.full((6,), math.nan)
    for got, bad in (((torch.zeros(6), nan), set()), ((torch.zeros(6), torch.zeros(6)), {"invstd"}),
                     ((nan, nan), {"mean"}), ((torch.zeros(6), torch.ones(6)), {"invstd"})):
        metrics = contract.judge("batch_norm_stats", want, dict(zip(("mean", "invstd"), got)))
        assert failing(metrics) == bad, (got, metrics)
    problem = dict(contract.judge("batch_norm_stats", want, {"mean": torch.zeros(6), "invstd": torch.ones(6)}))
    assert "6 values where the op's contract gives NaN are not NaN" in problem["batch_norm_stats.invstd"].problem


def judged_gather(mean, invstd, counts, rdtype, defect="", acc=F):
    rm, rv = torch.linspace(-1, 1, 6).to(rdtype), torch.linspace(0.5, 2, 6).to(rdtype)
    want = contract.gather(H, mean, invstd, counts.to(rdtype), rm, rv, 0.1, EPS)
    got_rm, got_rv = rm.clone(), rv.clone()
    mu, inv = gather(mean, invstd, counts, got_rm, got_rv, 0.1, acc, defect)
    return failing(contract.judge("batch_norm_gather_stats_with_counts", want, {
        "mean": mu, "invstd": inv, "running_mean": got_rm, "running_var": got_rv}))


def test_the_gather_merges_rows_by_count_and_a_zero_row_adds_nothing():
    mean, invstd, counts = rows()
    assert judged_gather(mean, invstd, counts, F) == set()
    assert judged_gather(mean.double(), invstd.double(), counts, D, acc=D) == set()
    assert judged_gather(mean, invstd, counts, H) == set()  # float16 running statistics, counts within range
    assert judged_gather(mean, invstd, counts, F, "variance-for-invstd") == {"invstd"}
    assert judged_gather(mean, invstd, counts, F, "equal-weights") == {"mean", "invstd", "running_mean",
                                                                        "running_var"}
    assert judged_gather(mean, invstd, counts, F, "biased-running-var") == {"running_var"}
    assert judged_gather(mean, invstd, counts, H, "half-count-sum") >= {"mean", "running_mean"}
    zero = (torch.cat([torch.zeros(1, 6), mean]), torch.cat([torch.zeros(1, 6), invstd]),
            torch.cat([torch.zeros(1), counts]))
    assert judged_gather(*zero, F) == set()
    # Its weight 0 keeps the mean (here: a sum, not CUDA's running merge), but 0 x an infinite variance is NaN.
    assert judged_gather(*zero, F, "zero-row-weighted") == {"invstd", "running_var"}


@pytest.mark.parametrize("dtype", [F, H, B])
def test_elemt_in_the_input_dtype_and_layout(dtype):
    x = activations(dtype, 3).contiguous(memory_format=torch.channels_last)
    mean, invstd = (t.to(F) for t in stats(x, D))
    w, b = torch.linspace(-1.5, 1.5, 6), torch.linspace(-0.5, 0.5, 6)
    want = contract.elemt(x, w, b, mean, invstd)
    for defect, bad in (("", set()), ("layout-lost", {"output"}), ("output-in-acc", set() if dtype == F else
                                                                     {"output"})):
        got = elemt(x, w, b, mean, invstd, F, defect)
        assert failing(contract.judge("batch_norm_elemt", want, {"output": got})) == bad, defect


def grads(dtype, scale=1.0):
    g = torch.Generator().manual_seed(7)
    return (scale * (0.5 + torch.randn(16, 6, 8, 16, generator=g, dtype=D))).to(dtype)


@pytest.mark.parametrize("dtype", [F, H, B, D])
def test_backward_reduce_sums_and_fails_without_the_mean_or_with_half_partials(dtype):
    x, g = activations(dtype, 4, shape=(16, 6, 8, 16)), grads(dtype, 64.0)
    acc = contract.acc(dtype)
    mean, invstd = stats(x, D)
    mean, invstd, w = mean.to(acc), invstd.to(acc), torch.linspace(0.5, 2, 6, dtype=acc)
    want = contract.backward_reduce(g, x, mean, invstd, w)
    names = ("sum_dy", "sum_dy_xmu", "grad_weight", "grad_bias")
    for defect, bad in (("", set()), ("mean-not-subtracted", {"sum_dy_xmu", "grad_weight"})):
        got = dict(zip(names, backward_reduce(g, x, mean, invstd, w, acc, defect)))
        assert failing(contract.judge("batch_norm_backward_reduce", want, got)) == bad, defect
    if dtype == H:  # sums of about 64 x 2,048 = 131,072 per channel: past 65,504
        got = dict(zip(names, backward_reduce(g, x, mean, invstd, w, acc, "half-partials")))
        assert failing(contract.judge("batch_norm_backward_reduce", want, got)) >= {"sum_dy", "grad_bias"}


@pytest.mark.parametrize("dtype", [F, H, B])
def test_backward_elemt_divides_by_the_groups_count(dtype):
    x, g = activations(dtype, 5), grads(dtype)[:5, :, :4, :3].contiguous()
    mean, invstd = (t.to(F) for t in stats(x, D))
    w = torch.linspace(0.5, 2, 6)
    sum_dy, sum_dy_xmu = (2 * t for t in backward_reduce(g, x, mean, invstd, w, D)[:2])  # two ranks like this one
    count = torch.tensor([[60], [60]], dtype=torch.int32)
    want = contract.backward_elemt(g, x, mean, invstd, w, sum_dy.float(), sum_dy_xmu.float(), count)
    for defect, bad in (("", set()), ("world-size-for-count", {"grad_input"})):
        got = backward_elemt(g, x, mean, invstd, w, sum_dy, sum_dy_xmu, count, F, defect)
        assert failing(contract.judge("batch_norm_backward_elemt", want, {"grad_input": got})) == bad, defect


def test_a_missing_output_fails_naming_it():
    x = activations(F, 0)
    metrics = dict(contract.judge("batch_norm_stats", contract.stats(x, EPS), {"mean": stats(x, F)[0]}))
    assert metrics["batch_norm_stats.mean"].ok and metrics["batch_norm_stats.invstd"].problem == \
        "the op returned no invstd"
