"""The elementwise comparison gives the whole tensor's metric whatever the batch slicing."""

from __future__ import annotations

import math

import pytest
import torch

from harness import slices
from harness.judge.elementwise import compare_tensor


def _case(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    true = torch.randn(12, 4, 9, 7, generator=gen, dtype=torch.float64)
    got = (true + 1e-3 * torch.randn(true.shape, generator=gen, dtype=torch.float64)).float()
    return got, true


@pytest.mark.parametrize("kind", ["per-channel", "whole", "function"])
def test_sliced_and_whole_comparisons_agree(monkeypatch, kind):
    got, true = _case()
    got[11, 3, 8, 6] += 0.5  # the worst element, in the last slice
    per_channel = torch.tensor([1e-2, 2e-2, 3e-2, 4e-2], dtype=torch.float64).view(1, 4, 1, 1)
    whole_tol = (per_channel * (1 + true.abs())).contiguous()
    tol = {"per-channel": per_channel, "whole": whole_tol, "function": lambda a, b: whole_tol[a:b]}[kind]
    whole = compare_tensor(got, true, tol, dtype=torch.float32)
    monkeypatch.setattr(slices, "CHUNK", 4 * 9 * 7)  # one sample a slice: 12 slices
    sliced = compare_tensor(got, true, tol, dtype=torch.float32)
    assert sliced == whole
    assert not whole.ok and whole.tol == pytest.approx(float(torch.broadcast_to(tol if kind != "function" else
                                                                                 whole_tol, true.shape)[11, 3, 8, 6]))


def test_non_finite_values_are_counted_over_every_slice(monkeypatch):
    got, true = _case(1)
    got[0, 0, 0, 0] = math.nan
    got[7, 2, 1, 1] = math.inf
    got[11, 3, 0, 0] = -math.inf
    monkeypatch.setattr(slices, "CHUNK", 4 * 9 * 7)
    m = compare_tensor(got, true, torch.tensor(1.0, dtype=torch.float64), dtype=torch.float32)
    assert m.problem == "3 non-finite values where the oracle is finite"


def test_a_truth_beyond_the_dtype_range_and_a_nan_truth_in_a_later_slice(monkeypatch):
    got, true = _case(2)
    true[9, 1, 2, 3] = 1e6  # beyond float16: infinity of its sign is exact
    true[10, 0, 0, 0] = math.nan  # nothing to compare there
    got = got.half()
    got[9, 1, 2, 3] = math.inf
    got[10, 0, 0, 0] = 123.0
    tol = torch.full((1, 4, 1, 1), 1e-2, dtype=torch.float64)
    monkeypatch.setattr(slices, "CHUNK", 4 * 9 * 7)
    m = compare_tensor(got, true, tol, dtype=torch.float16)
    assert m.ok, m
    got[9, 1, 2, 3] = -math.inf  # the wrong sign is a non-finite value where the truth is finite
    assert compare_tensor(got, true, tol, dtype=torch.float16).problem == (
        "1 non-finite values where the oracle is finite")


def test_zero_tolerance_passes_only_exact_values(monkeypatch):
    got, true = _case(3)
    exact = true.clone()
    monkeypatch.setattr(slices, "CHUNK", 4 * 9 * 7)
    zero = torch.zeros(1, dtype=torch.float64)
    assert compare_tensor(exact, true, zero).ok
    exact[5, 0, 0, 0] = torch.nextafter(exact[5, 0, 0, 0], torch.tensor(math.inf, dtype=torch.float64))
    assert not compare_tensor(exact, true, zero).ok


def test_a_structural_mismatch_carries_its_kind_and_an_old_record_gets_it_from_its_message():
    import math

    from harness.judge.metric import Metric, Problem

    true = torch.zeros(2, 3, dtype=torch.float64)
    ONE = torch.tensor(1.0, dtype=torch.float64)
    cases = {Problem.DTYPE: compare_tensor(torch.zeros(2, 3, dtype=torch.float16), true, ONE, dtype=torch.float32),
             Problem.SHAPE: compare_tensor(torch.zeros(3, 2), true, ONE),
             Problem.NON_FINITE: compare_tensor(torch.full((2, 3), math.nan), true, ONE)}
    for kind, m in cases.items():
        assert not m.ok and m.kind is kind, (kind, m)
        assert Metric.from_dict(m.to_dict()).to_dict() == m.to_dict()  # (NaN != NaN, the dicts say 'nan')
        old = {k: v for k, v in m.to_dict().items() if k != "kind"}  # as written before metrics had a kind
        assert Metric.from_dict(old).kind is kind
    x = torch.zeros(2, 3, 4, 4).contiguous(memory_format=torch.channels_last)
    m = compare_tensor(x.contiguous(), torch.zeros(2, 3, 4, 4, dtype=torch.float64), ONE,
                       memory_format=torch.channels_last)
    assert m.kind is Problem.LAYOUT
    assert compare_tensor(torch.ones(2, 3), true, ONE / 2).kind is None  # out of tolerance is not structural
