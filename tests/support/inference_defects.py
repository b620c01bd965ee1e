"""Planted defects for the no-group and inference families: SyncBNs correct in a process group, wrong without one
or at inference, each as an upstream one was.

Each is :class:`textbook.TextbookSyncBN` (correct, its converter included) with one hook changed:

- :class:`TrainsOnlyInAGroup`: training reduces over the world without asking whether there is one, as torch's
  SyncBatchNorm did before pytorch#89706 (pytorch#63662: "Default process group has not been initialized").
- :class:`EvalAsksTheWorld`: evaluation asks the world size first, as torch's did before pytorch#24815
  (pytorch#22538).
- :class:`HostBatchStats`: batch statistics in evaluation (no running statistics) go through the host as Python
  numbers. Eagerly correct; ``torch.jit.trace`` bakes the example batch's statistics into its program (wrong on
  any other batch). ``torch.export`` (2.13) keeps the read as symbolic numbers: its program is right.

``CAUGHT_BY``: for each, the default cases of the two families it must fail (shell-style patterns), and the
status; every other default case of the two families must pass.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from textbook import TextbookSyncBN


class TrainsOnlyInAGroup(TextbookSyncBN):
    """Training synchronizes over the world whether or not one was ever made."""

    def forward(self, x):
        if self.training:
            dist.get_world_size(self.group())  # what torch asked before pytorch#89706, initialized or not
        return super().forward(x)


class EvalAsksTheWorld(TextbookSyncBN):
    """Evaluation asks the world size, which raises where no process group exists."""

    def forward(self, x):
        if not self.training and dist.get_world_size(self.group()) > 1:
            pass  # nothing to do with the answer: asking is the defect
        return super().forward(x)


class HostBatchStats(TextbookSyncBN):
    """Evaluation's batch statistics read to the host and back."""

    def forward(self, x):
        if self.training or self.running_mean is not None:
            return super().forward(x)
        dims = [0] + list(range(2, x.dim()))
        xd = x.double()
        mean = torch.tensor(xd.mean(dims).tolist(), dtype=torch.float64)
        var = torch.tensor(xd.var(dims, unbiased=False).tolist(), dtype=torch.float64)
        y = self.normalize(x, mean, var)
        if self.affine:
            s = self.shape(x)
            y = y * self.weight.double().view(s) + self.bias.double().view(s)
        return self.finish(x, y)


CAUGHT_BY = {
    "TrainsOnlyInAGroup": (("no-group/*",), "error"),
    "EvalAsksTheWorld": (("no-group/*",), "error"),
    "HostBatchStats": (("no-group/model/no-running-stats/*", "inference/no-running-stats/*"), "mismatch"),
}
