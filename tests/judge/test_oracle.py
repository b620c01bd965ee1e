"""The float64 oracle against torch's own batch_norm (where it applies) and hand-derived values."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from harness.judge.oracle import run_oracle


def _torch_bn_steps(xs_steps, dys_steps, steps, *, momentum, affine, track, eps=1e-5):
    """Single-process float64 batch norm over the concatenated ranks: the oracle's definition."""
    C = xs_steps[0][0].shape[1]
    g = torch.Generator().manual_seed(7)
    w = torch.randn(C, generator=g, dtype=torch.float64).requires_grad_(affine)
    b = torch.randn(C, generator=g, dtype=torch.float64).requires_grad_(affine)
    rm = torch.zeros(C, dtype=torch.float64) if track else None
    rv = torch.ones(C, dtype=torch.float64) if track else None
    nbt = 0
    out = []
    for xs, dys, kind in zip(xs_steps, dys_steps, steps):
        x = torch.cat([t.double() for t in xs]).requires_grad_(True)
        dy = torch.cat([t.double() for t in dys])
        training = kind == "train"
        factor = momentum if momentum is not None else 0.0
        if training and track:
            nbt += 1
            if momentum is None:
                factor = 1.0 / nbt
        y = F.batch_norm(x, rm, rv, w if affine else None, b if affine else None,
                         training or not track, factor, eps)
        y.backward(dy)
        out.append(dict(y=y.detach(), gx=x.grad, gw=w.grad.clone() if affine else None,
                        gb=b.grad.clone() if affine else None, rm=None if rm is None else rm.clone(),
                        rv=None if rv is None else rv.clone(), nbt=nbt))
        if affine:
            w.grad = b.grad = None
    return w.detach(), b.detach(), out


@pytest.mark.parametrize("momentum", [0.1, None], ids=["momentum-0.1", "momentum-None"])
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no-affine"])
@pytest.mark.parametrize("track", [True, False], ids=["track", "no-track"])
def test_matches_torch_batch_norm_on_the_global_batch(momentum, affine, track):
    g = torch.Generator().manual_seed(0)
    steps = ["train", "train", "eval"] if track else ["train", "train"]
    sizes = [3, 1, 4]  # uneven batches, same spatial size: torch can take the concatenation
    xs = [[torch.randn(n, 5, 3, 2, generator=g, dtype=torch.float64) * 2 + 1 for n in sizes] for _ in steps]
    dys = [[torch.randn(n, 5, 3, 2, generator=g, dtype=torch.float64) for n in sizes] for _ in steps]
    w, b, want = _torch_bn_steps(xs, dys, steps, momentum=momentum, affine=affine, track=track)
    truths = run_oracle(xs, dys, steps, num_features=5, momentum=momentum, affine=affine,
                        track_running_stats=track, weight=w, bias=b, param_dtype=torch.float64)
    for truth, ref in zip(truths, want):
        torch.testing.assert_close(torch.cat(truth.output), ref["y"], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(torch.cat(truth.grad_input), ref["gx"], rtol=1e-10, atol=1e-12)
        if affine:
            torch.testing.assert_close(truth.grad_weight_sum, ref["gw"], rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(truth.grad_bias_sum, ref["gb"], rtol=1e-12, atol=1e-12)
        else:
            assert truth.grad_weight_sum is None
        for r in range(len(sizes)):
            if track:
                torch.testing.assert_close(truth.running_mean[r], ref["rm"], rtol=1e-12, atol=1e-14)
                torch.testing.assert_close(truth.running_var[r], ref["rv"], rtol=1e-12, atol=1e-14)
                assert truth.num_batches_tracked[r] == ref["nbt"]
            else:
                assert truth.running_mean[r] is None and truth.num_batches_tracked[r] is None


def test_ragged_ranks_by_hand():
    """Rank 0: one sample of 2 elements [1, 3]; rank 1: empty; rank 2: one sample of 3 elements [5, 7, 9]."""
    x0 = torch.tensor([1.0, 3.0]).view(1, 1, 2)
    x1 = torch.zeros(0, 1, 4)
    x2 = torch.tensor([5.0, 7.0, 9.0]).view(1, 1, 3)
    dy = [torch.ones_like(x0), torch.zeros_like(x1), torch.tensor([1.0, 0.0, -1.0]).view(1, 1, 3)]
    (t,) = run_oracle([[x0, x1, x2]], [dy], ["train"], num_features=1, eps=0.0, momentum=0.5,
                      weight=torch.tensor([2.0]), bias=torch.tensor([1.0]), param_dtype=torch.float64,
                      running_mean=torch.tensor([1.0]), running_var=torch.tensor([3.0]))
    # mean 5, biased var (16+4+0+4+16)/5 = 8, unbiased 10.
    s = math.sqrt(8.0)
    f64 = torch.float64
    torch.testing.assert_close(t.output[0].view(-1), torch.tensor([1 + 2 * -4 / s, 1 + 2 * -2 / s], dtype=f64))
    torch.testing.assert_close(t.output[2].view(-1), torch.tensor([1.0, 1 + 2 * 2 / s, 1 + 2 * 4 / s], dtype=f64))
    assert t.output[1].shape == (0, 1, 4)
    torch.testing.assert_close(t.running_mean[0], torch.tensor([0.5 * 1 + 0.5 * 5], dtype=torch.float64))
    torch.testing.assert_close(t.running_var[0], torch.tensor([0.5 * 3 + 0.5 * 10], dtype=torch.float64))
    # grad_bias shares: sum of dy per rank; grad_weight shares: sum dy * xhat per rank.
    torch.testing.assert_close(t.grad_bias[0], torch.tensor([2.0], dtype=torch.float64))
    torch.testing.assert_close(t.grad_bias[1], torch.tensor([0.0], dtype=torch.float64))
    torch.testing.assert_close(t.grad_weight[2], torch.tensor([(0 * 1 + 2 * 0 + 4 * -1) / s], dtype=torch.float64))
    torch.testing.assert_close(t.grad_weight_sum, torch.tensor([(-4 - 2 - 4) / s], dtype=torch.float64))
    # grad_input: w*invstd*(dy - mean(dy) - xhat*mean(dy*xhat)); mean(dy)=2/5, mean(dy*xhat) = -10/(5s).
    xhat = torch.tensor([-4.0, -2.0, 0.0, 2.0, 4.0], dtype=torch.float64) / s
    dyall = torch.tensor([1.0, 1.0, 1.0, 0.0, -1.0], dtype=torch.float64)
    want = 2 / s * (dyall - 0.4 - xhat * (dyall * xhat).mean())
    torch.testing.assert_close(torch.cat([t.grad_input[0].view(-1), t.grad_input[2].view(-1)]), want)


def test_spatial_sizes_differ_statistics_are_over_every_element():
    x0 = torch.arange(6.0).view(1, 1, 2, 3)
    x1 = torch.arange(6.0, 10.0).view(1, 1, 4, 1)
    dy = [torch.zeros_like(x0), torch.zeros_like(x1)]
    (t,) = run_oracle([[x0, x1]], [dy], ["train"], num_features=1, eps=0.0, param_dtype=torch.float64)
    allx = torch.arange(10.0, dtype=torch.float64)
    assert t.count == [10, 10]
    torch.testing.assert_close(t.mean[0], allx.mean().view(1))
    torch.testing.assert_close(t.invstd[1], (1 / allx.var(unbiased=False).sqrt()).view(1))


def test_subgroups_do_not_mix():
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(2, 3, 4, generator=g, dtype=torch.float64) + 10 * r for r in range(4)]
    dys = [torch.randn(2, 3, 4, generator=g, dtype=torch.float64) for _ in range(4)]
    (t,) = run_oracle([xs], [dys], ["train"], num_features=3, groups=[[0, 1], [2, 3]], param_dtype=torch.float64)
    (t01,) = run_oracle([xs[:2]], [dys[:2]], ["train"], num_features=3, param_dtype=torch.float64)
    torch.testing.assert_close(t.output[1], t01.output[1])
    torch.testing.assert_close(t.running_mean[0], t01.running_mean[0])
    assert not torch.allclose(t.running_mean[0], t.running_mean[2])


def test_eval_without_running_stats_uses_each_ranks_batch():
    g = torch.Generator().manual_seed(2)
    xs = [torch.randn(3, 2, 5, generator=g, dtype=torch.float64) + r for r in range(2)]
    dys = [torch.randn(3, 2, 5, generator=g, dtype=torch.float64) for _ in range(2)]
    (t,) = run_oracle([xs], [dys], ["eval"], num_features=2, track_running_stats=False, param_dtype=torch.float64)
    for r in range(2):
        want = F.batch_norm(xs[r], None, None, None, None, True, 0.0, 1e-5)
        torch.testing.assert_close(t.output[r], want)


def test_buffers_round_to_the_parameter_dtype():
    x = [[torch.full((2, 1, 3), 1.0001, dtype=torch.float64), torch.full((2, 1, 3), 1.0003, dtype=torch.float64)]]
    dy = [[torch.zeros(2, 1, 3, dtype=torch.float64)] * 2]
    (t,) = run_oracle(x, dy, ["train"], num_features=1, momentum=1.0, param_dtype=torch.float16)
    assert float(t.running_mean[0]) == float(torch.tensor(1.0002, dtype=torch.float64).half())


def test_bad_groups_are_rejected():
    x = [[torch.zeros(1, 1, 2)] * 2]
    with pytest.raises(ValueError, match="partition"):
        run_oracle(x, x, ["train"], num_features=1, groups=[[0]])


@pytest.mark.parametrize("momentum", [0.1, None], ids=["momentum-0.1", "momentum-None"])
def test_an_all_empty_step_follows_batchnorm(momentum):
    """Every rank empty: nn.BatchNorm over the same (empty) batch counts the step and keeps its statistics."""
    g = torch.Generator().manual_seed(3)
    full = [torch.randn(n, 3, 2, generator=g, dtype=torch.float64) for n in (2, 3)]
    empty = [torch.zeros(0, 3, 2, dtype=torch.float64)] * 2
    dys = [[torch.randn_like(x) for x in xs] for xs in (full, empty, full)]
    truths = run_oracle([full, empty, full], dys, ["train"] * 3, num_features=3, momentum=momentum,
                        param_dtype=torch.float64)
    bn = torch.nn.BatchNorm1d(3, momentum=momentum).double()
    for s, xs in enumerate((full, empty, full)):
        bn(torch.cat(xs))
        torch.testing.assert_close(truths[s].running_mean[0], bn.running_mean)
        torch.testing.assert_close(truths[s].running_var[1], bn.running_var)
        assert truths[s].num_batches_tracked == [int(bn.num_batches_tracked)] * 2
    assert truths[1].raises is None
    assert all(float(w.abs().sum()) == 0 for w in truths[1].grad_weight)
    assert all(t.isfinite().all() for t in truths[1].grad_weight)


def test_one_value_per_channel_in_the_group_is_refused_as_batchnorm_refuses_it():
    """One value per channel over the whole group: nn.BatchNorm raises, so the oracle stops at that step."""
    one = [torch.ones(1, 3, dtype=torch.float64), torch.zeros(0, 3, dtype=torch.float64)]
    two = [torch.ones(2, 3, dtype=torch.float64), torch.zeros(1, 3, dtype=torch.float64)]
    dys = [[torch.ones_like(x) for x in xs] for xs in (two, one, two)]
    truths = run_oracle([two, one, two], dys, ["train"] * 3, num_features=3, param_dtype=torch.float64)
    assert len(truths) == 2 and truths[0].raises is None
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        torch.nn.BatchNorm1d(3)(torch.cat(one).float())
    assert truths[1].raises.startswith("Expected more than 1 value per channel")
    # A single value on one rank of a larger group is an ordinary step.
    single = [torch.ones(1, 3, dtype=torch.float64), torch.zeros(1, 3, dtype=torch.float64)]
    (t,) = run_oracle([single], [single], ["train"], num_features=3, param_dtype=torch.float64)
    assert t.raises is None and t.running_var[0].isfinite().all()


def test_frozen_buffers_follow_a_batchnorm_whose_flag_was_switched_off_after_construction():
    # nn.BatchNorm itself, with buffers, then track_running_stats = False: training normalizes with batch
    # statistics and leaves the buffers and their count alone; eval normalizes with the buffers.
    g = torch.Generator().manual_seed(3)
    steps = ["train", "eval", "train"]
    sizes = [2, 5]
    xs = [[torch.randn(n, 4, 3, generator=g, dtype=torch.float64) * 3 + 2 for n in sizes] for _ in steps]
    dys = [[torch.randn(n, 4, 3, generator=g, dtype=torch.float64) for n in sizes] for _ in steps]
    bn = torch.nn.BatchNorm1d(4, dtype=torch.float64)
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1, generator=g)
        bn.running_var.uniform_(0.5, 2, generator=g)
    start_mean, start_var = bn.running_mean.clone(), bn.running_var.clone()
    bn.track_running_stats = False
    truths = run_oracle(xs, dys, steps, num_features=4, param_dtype=torch.float64, running_mean=start_mean,
                        running_var=start_var, frozen_buffers=True)
    for s, kind in enumerate(steps):
        bn.train(kind == "train")
        x = torch.cat(xs[s]).requires_grad_(True)
        y = bn(x)
        y.backward(torch.cat(dys[s]))
        torch.testing.assert_close(torch.cat(truths[s].output), y.detach(), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(torch.cat(truths[s].grad_input), x.grad, rtol=1e-10, atol=1e-12)
        for r in range(len(sizes)):
            assert torch.equal(truths[s].running_mean[r], bn.running_mean)
            assert torch.equal(truths[s].running_var[r], bn.running_var)
            assert truths[s].num_batches_tracked[r] == int(bn.num_batches_tracked) == 0
        bn.zero_grad()
    assert torch.equal(bn.running_mean, start_mean)


def test_a_count_from_before_carries_momentum_nones_average_on():
    g = torch.Generator().manual_seed(4)
    xs = [[torch.randn(n, 3, 2, generator=g, dtype=torch.float64) + 1 for n in (3, 2)] for _ in range(2)]
    dys = [[torch.zeros_like(x) for x in step] for step in xs]
    bn = torch.nn.BatchNorm1d(3, momentum=None, dtype=torch.float64)
    bn.num_batches_tracked.fill_(5)
    truths = run_oracle(xs, dys, ["train", "train"], num_features=3, momentum=None, param_dtype=torch.float64,
                        batches_tracked=5)
    for s in range(2):
        bn(torch.cat(xs[s]))
        torch.testing.assert_close(truths[s].running_mean[0], bn.running_mean, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(truths[s].running_var[1], bn.running_var, rtol=1e-12, atol=1e-14)
        assert truths[s].num_batches_tracked[0] == int(bn.num_batches_tracked) == 6 + s
