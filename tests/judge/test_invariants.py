"""Bitwise equality across ranks, and the distance in ULPs when it fails."""

from __future__ import annotations

import torch

from harness.judge.invariants import bits, compare_across, ulps


def test_equal_tensors_pass_and_a_one_ulp_drift_is_named():
    a = torch.tensor([1.0, -2.5, 3.25], dtype=torch.float32)
    b = a.clone()
    b[1] = torch.nextafter(b[1], torch.tensor(0.0))
    assert compare_across("running_var", {0: bits(a), 1: bits(a.clone())}, [[0, 1]]) is None
    bad = compare_across("step2.train.running_var", {0: bits(a), 1: bits(b)}, [[0, 1]])
    assert bad is not None and not bad.ok
    assert "step2.train.running_var differs across ranks: rank 0 vs rank 1: 1 element differ, by up to 1 ULPs" \
        in bad.problem


def test_ulps_count_across_zero_and_per_dtype():
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        x = torch.tensor([0.0, 1.0], dtype=dtype)
        y = torch.tensor([-0.0, 1.0], dtype=dtype)
        assert ulps(bits(x), bits(y)) == (0, 0)  # -0 and +0 are the same number
        tiny = torch.nextafter(torch.tensor(0.0, dtype=dtype), torch.tensor(1.0, dtype=dtype))
        neg = -tiny
        assert ulps(bits(tiny.reshape(1)), bits(neg.reshape(1))) == (1, 2)
    assert ulps(bits(torch.ones(2)), bits(torch.ones(2, dtype=torch.float64)))[0] < 0


def test_groups_are_compared_apart_and_counts_exactly():
    a, b = torch.tensor([1.0]), torch.tensor([2.0])
    per_rank = {0: bits(a), 1: bits(a.clone()), 2: bits(b), 3: bits(b.clone())}
    assert compare_across("x", per_rank, [[0, 1], [2, 3]]) is None  # different groups may differ
    assert compare_across("x", per_rank, [[0, 1, 2, 3]]) is not None
    n = compare_across("num_batches_tracked", {0: bits(torch.tensor(3)), 1: bits(torch.tensor(4))}, [[0, 1]])
    assert "by up to 1 counts" in n.problem
