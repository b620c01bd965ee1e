"""Tolerances at the sizes networks train at: wide enough for float32 arithmetic, tight enough for a defect
of one ULP per element.

The tolerance of a reduction grows like sqrt(N) (random rounding), so at
N = 802,816 values per channel (ResNet-50's stem at 32 images on each of two
ranks) a correct float32 computation (float32 statistics, two passes, the
normalization in float32) must still pass, and a sum that loses one unit in
the last place of its float32 accumulator at every element (chopped instead
of rounded accumulation: an error that grows like N) must fail. The oracle's
per-channel reductions stay bounded (no concatenation of ranks, slices
widened one at a time), checked by the peak of what it allocates.
"""

from __future__ import annotations

import torch

from harness.catalog.case import Case
from harness.catalog.data import materialize
from harness.judge.compare import judge_rank
from harness.judge.oracle import run_oracle
from harness.slices import CHUNK

STEM = (32, (112, 112))  # images per rank, spatial: 401,408 values per channel per rank


def stem_case(channels: int = 2) -> Case:
    n, sp = STEM
    return Case(id="scale/test-stem/ws2", family="scale", batch_sizes=(n, n), spatial=(sp, sp), channels=channels,
                input_mean=3.0)


def float32_syncbn(xs, w, b, eps, mean_error=None):
    """Outputs of a float32 SyncBN over the ranks' inputs (``mean_error``: added to its float32 mean)."""
    dims = [0, 2, 3]
    n = sum(x.numel() // x.shape[1] for x in xs)
    mean = sum(x.float().sum(dims) for x in xs) / n
    if mean_error is not None:
        mean = mean + mean_error.float()
    var = sum(((x.float() - mean.view(1, -1, 1, 1)) ** 2).sum(dims) for x in xs) / n
    invstd = torch.rsqrt(var + eps)
    return [((x.float() - mean.view(1, -1, 1, 1)) * (invstd * w.float()).view(1, -1, 1, 1)
             + b.float().view(1, -1, 1, 1)) for x in xs]


def chopped_sum_error(xs) -> torch.Tensor:
    """Per channel, what a float32 running sum loses when each addition truncates instead of rounding:
    half a unit in the last place of the partial sum per element on average (the partial sums taken in
    float64, in the order the elements are added)."""
    flat = torch.cat([x.double().transpose(0, 1).reshape(x.shape[1], -1) for x in xs], dim=1)
    partial = flat.cumsum(dim=1).abs().clamp_min(1e-30)
    ulp = torch.exp2(torch.floor(torch.log2(partial)) - 23)
    return -0.5 * ulp.sum(dim=1) / flat.shape[1]


def judged_output(case, data, truths, outputs):
    observed = [{"output": outputs[0], "grads": "none", "running_mean": None, "running_var": None,
                 "num_batches_tracked": None}]
    metrics = dict(judge_rank(case, 0, data, truths, observed))
    return metrics["step0.train.output"]


def test_float32_arithmetic_passes_and_one_ulp_per_element_fails_at_resnet_stem_size():
    case = stem_case()
    data = materialize(case)
    truths = run_oracle(data.inputs, data.grad_outputs, case.steps, num_features=case.channels, eps=case.eps,
                        momentum=case.momentum, weight=data.weight, bias=data.bias,
                        running_mean=data.running_mean, running_var=data.running_var, ranks=[0])
    xs = data.inputs[0]
    good = judged_output(case, data, truths, float32_syncbn(xs, data.weight, data.bias, case.eps))
    assert good.ok, good.describe()
    error = chopped_sum_error(xs)
    bad = judged_output(case, data, truths, float32_syncbn(xs, data.weight, data.bias, case.eps, mean_error=error))
    assert not bad.ok and bad.ratio > 2, bad.describe()
    # The same defect at a toy size (a few hundred values) stays within rounding: size is what shows it.
    small = Case(id="scale/test-small/ws2", family="scale", batch_sizes=(2, 2), spatial=((8, 8),) * 2, channels=2,
                 input_mean=3.0)
    sd = materialize(small)
    st = run_oracle(sd.inputs, sd.grad_outputs, small.steps, num_features=2, weight=sd.weight, bias=sd.bias,
                    running_mean=sd.running_mean, running_var=sd.running_var, ranks=[0])
    toy = judged_output(small, sd, st, float32_syncbn(sd.inputs[0], sd.weight, sd.bias, small.eps,
                                                      mean_error=chopped_sum_error(sd.inputs[0])))
    assert toy.ok, toy.describe()


def test_the_oracle_reduces_a_slice_at_a_time_and_only_for_the_rank_asked(monkeypatch):
    from harness import slices

    case = stem_case(channels=1)
    data = materialize(case)

    def truth():
        (t,) = run_oracle(data.inputs, data.grad_outputs, case.steps, num_features=1, weight=data.weight,
                          bias=data.bias, running_mean=data.running_mean, running_var=data.running_var, ranks=[1])
        return t

    whole = truth()
    monkeypatch.setattr(slices, "CHUNK", 112 * 112)  # one sample a slice: 32 slices per rank
    sliced = truth()
    assert sliced.output[0] is None and sliced.output[1] is not None
    assert sliced.count == [2 * 401_408, 2 * 401_408]
    x = torch.cat([t.double() for t in data.inputs[0]])
    torch.testing.assert_close(sliced.mean[0], x.mean(dim=(0, 2, 3)), rtol=1e-13, atol=0)
    torch.testing.assert_close(sliced.invstd[0], 1 / torch.sqrt(x.var(dim=(0, 2, 3), unbiased=False) + case.eps),
                               rtol=1e-12, atol=0)
    for name in ("output", "grad_input"):
        torch.testing.assert_close(getattr(sliced, name)[1], getattr(whole, name)[1], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(sliced.grad_weight_sum, whole.grad_weight_sum, rtol=1e-12, atol=1e-9)
    assert CHUNK > 112 * 112
