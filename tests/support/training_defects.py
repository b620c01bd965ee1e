"""Planted defects that show only in a training system: a use of the layer or a way of training a network.

``SilentOnceDifferentiable`` and ``SyncsInEval`` are caught by the catalog's
training-use families (tests/scenarios/test_uses.py). ``SEARCH_ONLY`` lists
those the default selection does not catch and ``search --system all``
must find (tests/search/test_systems.py), each with what its minimal case must
keep. Each is written as such defects are: a shortcut right wherever its
author looked.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from float32_syncbn import Float32SyncBN
from textbook import TextbookSyncBN


class SilentOnceDifferentiable(Float32SyncBN):
    """Claims double backward, but its hand-written backward is not differentiable: autograd silently drops
    the penalty's path through the statistics (what a custom Function without ``once_differentiable`` does)."""

    capabilities = {"convert": True, "double_backward": True, "script": False}


class SyncsInEval(TextbookSyncBN):
    """Issues a barrier in evaluation too (a layer that synchronizes whatever its mode): validation on a subset
    of ranks hangs there."""

    def forward(self, x):
        if not self.training and dist.is_initialized():
            dist.barrier(group=self.group())
        return super().forward(x)


class SyncsOnlyWhenWeightTrains(TextbookSyncBN):
    """Synchronizes the statistics only when its weight requires grad ("frozen layers are for inference"):
    with the affine parameters frozen while the statistics still train (a norm config with
    ``requires_grad=False``, common when fine-tuning detectors), each rank normalizes with its own batch."""

    def batch_stats(self, x, dims):
        if self.affine and not self.weight.requires_grad:
            xd = x.double()
            return xd.mean(dims), xd.var(dims, unbiased=False), torch.tensor(x.numel() / x.shape[1])
        return super().batch_stats(x, dims)


class SyncsOnlyWithInputGrad(TextbookSyncBN):
    """Synchronizes only when its input requires grad ("no autograd, no training"): right inside every network
    (a conv before it makes its input require grad) and on every layer case (the harness's inputs require
    grad), wrong as the first layer of a network fed plain data."""

    def batch_stats(self, x, dims):
        if not x.requires_grad:
            xd = x.double()
            return xd.mean(dims), xd.var(dims, unbiased=False), torch.tensor(x.numel() / x.shape[1])
        return super().batch_stats(x, dims)


def _autocast_on() -> bool:
    try:
        return torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda")
    except TypeError:  # releases before the device_type argument
        return torch.is_autocast_cpu_enabled() or torch.is_autocast_enabled()


class AutocastIgnoresMomentumNone(TextbookSyncBN):
    """Its autocast path (a fused update written for mixed precision) takes the momentum as a float and falls
    back to 0.1 when it is None: the cumulative average is lost, under autocast only. The catalog has
    momentum=None and autocast, never both."""

    def momentum_factor(self):
        if self.momentum is None and _autocast_on():
            return 0.1
        return super().momentum_factor()


# defect -> (the systems search draws to find it, what its minimal case must keep: a predicate and its words)
SEARCH_ONLY = {
    SyncsOnlyWhenWeightTrains: (lambda c: "frozen-norm" in c.options, "frozen-norm"),
    SyncsOnlyWithInputGrad: (lambda c: "data-input" in c.options and c.model == "bn-first",
                             "data-input on bn-first"),
    AutocastIgnoresMomentumNone: (lambda c: c.use == "autocast" and c.momentum is None, "autocast, momentum None"),
}
