"""CUDA's merge of gathered statistics with half or bfloat16 counts, as the torch emulation runs it.

Design: the arithmetic of :func:`harness.impls.cuda_gather.merge` checked three ways: on pytorch#70901's own
example (counts whose sum passes 65,504 in float16: CUDA returns a mean of 0), against an exact float64 merge where
no rounding of the counts happens, and on a bfloat16 count sum that rounds (the weights then do not sum to 1, by
the amount worked out by hand). On a GPU (``cuda`` marker) the model is set against torch's real kernel.
"""

from __future__ import annotations

import pytest
import torch

from harness.impls import cuda_gather


def exact(mean, invstd, counts, eps):
    """The float64 merge of (mean, invstd, count) rows: global mean and biased variance."""
    m, c = mean.double(), counts.double()[:, None]
    var = (1 / invstd.double()) ** 2 - eps
    n = c.sum()
    gm = (c * m).sum(0) / n
    gv = (c * (var + (m - gm) ** 2)).sum(0) / n
    return gm, gv


def rows(w, ch, seed=0):
    g = torch.Generator().manual_seed(seed)
    mean = torch.randn(w, ch, generator=g) + 1.0
    invstd = 1 / (torch.rand(w, ch, generator=g) + 0.5)
    return mean, invstd


def test_pytorch_70901_example_gives_a_zero_mean():
    """150 rows of count 500 in float16 (the issue's report): the running count passes 65,504 and the mean is 0."""
    mean, invstd = rows(150, 4)
    counts = torch.full((150,), 500.0, dtype=torch.float16)
    rm, rv = torch.rand(4).half(), torch.rand(4).half() + 1e-4
    got, _ = cuda_gather.merge(mean, invstd, rm, rv, 0.1, 1e-3, counts)
    assert torch.equal(got, torch.zeros(4))


def test_counts_that_stay_exact_merge_like_float64():
    mean, invstd = rows(3, 5)
    counts = torch.tensor([1000.0, 1500.0, 750.0], dtype=torch.float16)
    rm, rv = torch.zeros(5, dtype=torch.float16), torch.ones(5, dtype=torch.float16)
    got_mean, got_invstd = cuda_gather.merge(mean, invstd, rm, rv, 0.5, 1e-5, counts)
    want_mean, want_var = exact(mean, invstd, counts, 1e-5)
    torch.testing.assert_close(got_mean.double(), want_mean, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close((1 / got_invstd.double() ** 2 - 1e-5), want_var, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(rm.double(), (0.5 * want_mean).half().double(), rtol=2e-3, atol=1e-3)
    unbiased = want_var * 3250 / 3249
    torch.testing.assert_close(rv.double(), (0.5 + 0.5 * unbiased).half().double(), rtol=2e-3, atol=1e-3)


def test_a_bfloat16_count_sum_that_rounds_skews_the_weights():
    """n + count = 257 rounds to 256 in bfloat16: the second row gets weight 1/256, the first 256/256."""
    mean = torch.tensor([[1.0], [3.0]])
    invstd = torch.ones(2, 1)
    counts = torch.tensor([256.0, 1.0], dtype=torch.bfloat16)
    got, _ = cuda_gather.merge(mean, invstd, None, None, 0.1, 0.0, counts)
    assert got.item() == pytest.approx(1.0 + 3.0 / 256, rel=1e-6)  # exact: (256 * 1 + 3) / 257


def test_overflowing_counts_in_the_index_type_saturate_instead_of_raising():
    mean, invstd = rows(2, 3)
    counts = torch.tensor([65520.0, 1.0], dtype=torch.float16)  # the first is inf in float16
    got_mean, got_invstd = cuda_gather.merge(mean, invstd, None, None, 0.1, 1e-5, counts)
    assert not torch.isfinite(got_mean).all() or not torch.isfinite(got_invstd).all()


def test_only_reduced_counts_take_cudas_path():
    assert cuda_gather.needed(torch.ones(2, dtype=torch.float16))
    assert cuda_gather.needed(torch.ones(2, dtype=torch.bfloat16))
    assert not cuda_gather.needed(torch.ones(2, dtype=torch.float32))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("counts", [[50176.0, 50176.0], [1000.0, 1500.0, 750.0], [256.0, 1.0], [40000.0, 30000.0]])
def test_the_model_matches_cudas_kernel(dtype, counts):
    w, ch = len(counts), 7
    mean, invstd = rows(w, ch, seed=w)
    c = torch.tensor(counts, dtype=dtype)
    rm, rv = torch.zeros(ch, dtype=dtype), torch.ones(ch, dtype=dtype)
    want_mean, want_invstd = cuda_gather.merge(mean, invstd, rm, rv, 0.1, 1e-5, c)
    crm, crv = torch.zeros(ch, dtype=dtype, device="cuda"), torch.ones(ch, dtype=dtype, device="cuda")
    got_mean, got_invstd = torch.batch_norm_gather_stats_with_counts(
        torch.empty(1, ch, device="cuda", dtype=dtype), mean.cuda(), invstd.cuda(), crm, crv, 0.1, 1e-5, c.cuda())
    torch.testing.assert_close(got_mean.cpu(), want_mean, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_invstd.cpu(), want_invstd, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(crm.cpu(), rm)  # half or bfloat16: one rounding of the float result
    torch.testing.assert_close(crv.cpu(), rv)
