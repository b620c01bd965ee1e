"""Planted defects that show only in a training use (a gradient penalty, validation on one rank).

Each is a correct layer made wrong in one place; tests/scenarios/test_uses.py
checks that the use's family catches it and that its correct twin passes.
"""

from __future__ import annotations

import torch.distributed as dist

from float32_syncbn import Float32SyncBN
from harness.impls.base import Capabilities
from textbook import TextbookSyncBN


class SilentOnceDifferentiable(Float32SyncBN):
    """Claims double backward, but its hand-written backward is not differentiable: autograd silently drops
    the penalty's path through the statistics (what a custom Function without ``once_differentiable`` does)."""

    capabilities = Capabilities(convert=True, double_backward=True, script=False)


class SyncsInEval(TextbookSyncBN):
    """Issues a barrier in evaluation too (a layer that synchronizes whatever its mode): validation on a subset
    of ranks hangs there."""

    def forward(self, x):
        if not self.training and dist.is_initialized():
            dist.barrier(group=self.group())
        return super().forward(x)
