"""Planted defects that the default selection does not catch and ``search`` must find.

Each is written as such defects are really written: a fast path that is
right on every shape its author tried. ``SEARCH_ONLY`` says what each needs
to show, which is what its shrunk case must still have.
"""

from __future__ import annotations

import torch

from textbook import TextbookSyncBN


class DropsBlockTail(TextbookSyncBN):
    """Past one block of 2^17 values per channel on a rank, the statistics kernel reduces whole blocks only and
    drops the partial last one (a grid sized for full blocks). Right on every catalog case (at most 18,432
    values per channel per rank, and the scale family's default rows stay under one block); wrong at the
    sizes networks train at, unless the count is a multiple of the block."""

    BLOCK = 1 << 17

    def batch_stats(self, x, dims):
        c = x.shape[1]
        n = x.numel() // c
        if n <= self.BLOCK:
            return super().batch_stats(x, dims)
        flat = x.double().transpose(0, 1).reshape(c, -1)
        kept = flat[:, : (n // self.BLOCK) * self.BLOCK]
        both = self.reduce(torch.cat([torch.full((1,), float(n), dtype=torch.float64), kept.sum(1)]))
        total, mean = both[0], both[1:] / both[0]
        var = self.reduce(((kept - mean[:, None]) ** 2).sum(1)) / total
        return mean, var, total


class HalfInputCumulativeAverage(TextbookSyncBN):
    """momentum=None's cumulative average, written with fully half models in mind, computes the running
    statistics' update in the input's dtype: with float16 or bfloat16 input and float32 buffers (a float32
    layer under autocast), every update is rounded to 11 or 8 bits. Needs two conditions at once: half input
    and momentum=None; the catalog has each alone, never both. With half buffers too, the update is rounded
    three times instead of once: one ulp off, which shows where one ulp of the buffer exceeds its tolerance
    (subnormal running variances, found by the search with one intra-op thread per rank)."""

    def forward(self, x):
        self._input_dtype = x.dtype
        return super().forward(x)

    def update_running(self, mean, var, n, factor):
        dt = getattr(self, "_input_dtype", None)
        if self.momentum is not None or dt not in (torch.float16, torch.bfloat16):
            return super().update_running(mean, var, n, factor)
        with torch.no_grad():
            unbiased = var * n / (n - 1) if n > 1 else torch.full_like(var, float("inf"))
            self.running_mean.copy_((1 - factor) * self.running_mean.to(dt) + factor * mean.to(dt))
            self.running_var.copy_((1 - factor) * self.running_var.to(dt) + factor * unbiased.to(dt))


class CountCachedOnceStable(TextbookSyncBN):
    """Once three training forwards in a row had the same local batch shape, the global count is cached (a
    fast path meant to skip a reduction in steady state) and used from then on, also when the last batch of
    the epoch is smaller. A step-sequence defect: it needs at least four training forwards, the first three of
    one shape; the catalog's changing-batch cases change sooner or have three steps."""

    def batch_stats(self, x, dims):
        xd = x.double()
        c = x.shape[1]
        both = self.reduce(torch.cat([torch.full((1,), x.numel() / c, dtype=torch.float64), xd.sum(dims)]))
        n = both[0]
        cached = getattr(self, "_stable_count", None)
        if cached is not None:
            n = torch.full_like(n, cached)
        shapes = (getattr(self, "_shapes", []) + [tuple(x.shape)])[-3:]
        self._shapes = shapes
        if cached is None and len(shapes) == 3 and len(set(shapes)) == 1:
            self._stable_count = float(both[0])
        mean = both[1:] / n
        d = xd - mean.view(self.shape(x))
        return mean, self.reduce((d * d).sum(dims)) / n, n


class CumulativeAverageAndCachedCount(HalfInputCumulativeAverage, CountCachedOnceStable):
    """Two of the defects above in one implementation, as a real one may have them: two causes (the running
    statistics' update, the training forward's count), each with its own condition, so two findings."""


# Defect -> what its shrunk case must still have (a predicate over the case) and the tensor it corrupts.
SEARCH_ONLY = {
    DropsBlockTail: (lambda c: max(b * _prod(sp) for s in range(len(c.steps)) for b, sp in zip(c.sizes_at(s),
                                                                                              c.spatial))
                     > DropsBlockTail.BLOCK, "output"),
    HalfInputCumulativeAverage: (lambda c: c.dtype in ("float16", "bfloat16") and c.momentum is None, "running_"),
    CountCachedOnceStable: (lambda c: sum(k in ("train", "fwd", "nograd") for k in c.steps) >= 4
                            and c.step_batch_sizes is not None, "train."),
}


def _prod(xs) -> int:
    out = 1
    for v in xs:
        out *= v
    return out
