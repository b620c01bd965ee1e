"""The harness's own channel between the ranks of a pool: the oracle's per-channel sums, summed over a group.

A case whose samples are drawn per rank (``Case.draws == "per-rank"``: search's cases) lets each rank make
only its own inputs. The float64 truth of a synchronized step still needs sums over every rank of the group
(count, sum(x), then the sums of squared deviations and of the gradients' products); each rank adds its own
and :meth:`Exchange.sum` all-reduces them over the group. That is a few hundred floats per step, where making
and summing every rank's tensors on every rank cost ``world_size`` times a rank's own work.

Design:
- One gloo process group of the harness's own over the whole pool (CPU tensors: the oracle works on CPU
  whatever the case's device and backend), made the first time a case needs it (``new_group`` is collective:
  every rank makes it at the same point, the first task of a case drawn per rank) and kept for the pool's
  life. Subgroups are not made: a case's groups change from case to case and each new gloo group costs a
  rendezvous. A sum over a group instead all-reduces a tensor with one slot per rank, each rank filling its
  own, and adds the group's slots in rank order: exactly what a process holding every rank's part adds.
- So every rank makes the same calls in the same order whatever its group: the oracle exchanges in training
  steps only (an evaluation step normalizes each rank alone), twice a step, on every rank.
- Its calls go to the process group object directly, not through ``torch.distributed``'s functions, so the
  collective recorder (:mod:`harness.engine.collectives`) never sees them: an implementation's collectives
  stay the only ones in its fingerprint.
- A rank that died before its call leaves the others waiting, which the pool's timeout ends like any hang.
"""

from __future__ import annotations

from typing import Sequence

import torch


class Exchange:
    """Sums over the ranks of a group, for one rank process (see the module docstring)."""

    def __init__(self, rank: int, world_size: int):
        self.rank = rank
        self.world_size = world_size
        self._group = None
        self.calls = 0  # how many sums this process made (for tests)

    def prepare(self) -> None:
        """Make the harness's process group if not made yet: collective, so every rank calls it at the same point."""
        if self._group is None:
            import torch.distributed as dist

            self._group = dist.new_group(list(range(self.world_size)), backend="gloo")

    def sum(self, tensor: torch.Tensor, unit: Sequence[int]) -> torch.Tensor:
        """``tensor`` (this rank's part) summed over the ranks of ``unit``, in rank order. Every rank of the pool
        must call it at the same point, each with its own part and group."""
        if self._group is None:
            raise RuntimeError("the exchange's process group is not made: call prepare() first")
        slots = torch.zeros((self.world_size, *tensor.shape), dtype=tensor.dtype)
        slots[self.rank] = tensor
        self._group.allreduce([slots]).wait()
        self.calls += 1
        return sum(slots[r] for r in unit)
