"""A plugin whose private ops are torch's, with a change planted on request: a second build under one name.

``Planted`` is ``torch.nn.SyncBatchNorm`` (its layer is never run by the ``private-ops`` family) with a
``private_ops`` attribute: torch's five ops as the ``torch`` adapter calls them (CUDA's kernels where there is a
GPU, else the cpu-emulation's, installed in the rank process on first use), but for the changes that
``SYNCBN_TEST_PLANTED_OPS`` names (comma-separated), read at each call in the rank processes:

- ``gather-variance``: ``batch_norm_gather_stats_with_counts`` returns the merged variance where its invstd
  belongs (a change of what an op computes);
- ``stats-keyword``: ``batch_norm_stats`` takes ``eps`` by keyword only (a change of its schema: the positional
  call its callers make raises ``TypeError``).

So the same implementation name, run with and without the variable, stands for a build and its successor.
"""

from __future__ import annotations

import os

import torch

PLANTED = "SYNCBN_TEST_PLANTED_OPS"


class _TorchOpsWithPlants:
    """torch's ops by name, each with its planted change where :data:`PLANTED` names one."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if not torch.cuda.is_available():
            from harness.impls import torch_emulation

            torch_emulation.install()
        op = getattr(torch, name)
        planted = set(os.environ.get(PLANTED, "").split(","))
        if name == "batch_norm_gather_stats_with_counts" and "gather-variance" in planted:
            def gather(*args):
                mean, invstd = op(*args)
                return mean, 1.0 / (invstd * invstd) - args[6]  # args[6]: eps

            return gather
        if name == "batch_norm_stats" and "stats-keyword" in planted:
            def stats(input, *, eps):
                return op(input, eps)

            return stats
        return op


class Planted(torch.nn.SyncBatchNorm):
    """torch's SyncBatchNorm, and torch's private ops with the planted changes (see the module docstring)."""

    private_ops = _TorchOpsWithPlants()
