"""Invariants across ranks: what must be bitwise the same on every rank of a group.

A correct SyncBN runs the same arithmetic on the same gathered data on every
rank, so each rank's running statistics and ``num_batches_tracked`` (and,
under DDP, the all-reduced gradients and the parameters after a step) are
bitwise identical across the ranks of a group, whatever the tolerance to the
oracle. Replicas that drift apart by a few ULPs per step diverge over a long
training run; a difference is a mismatch naming the ranks, the tensor and the
largest distance in ULPs.

Protocol: each rank sends :func:`bits` of such a tensor (its dtype and its
elements' bit patterns as integers: plain data, exact); the parent compares
the ranks of each group with :func:`compare_across`.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from harness.catalog.data import DTYPES
from harness.judge.metric import Metric

_INT_OF = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
           torch.float64: torch.int64}  # the integer type of each float dtype's width, to send its bits exactly


def bits(t: Optional[torch.Tensor]):
    """A tensor's exact contents as plain data (``None`` stays ``None``; integers are sent as they are)."""
    if t is None:
        return None
    t = t.detach().cpu().contiguous()
    if t.dtype in _INT_OF:
        return {"dtype": str(t.dtype).replace("torch.", ""), "bits": t.view(_INT_OF[t.dtype]).reshape(-1).tolist()}
    return {"dtype": str(t.dtype).replace("torch.", ""), "values": t.reshape(-1).tolist()}


def _ordered(b: list[int], width: int) -> list[int]:
    """Bit patterns mapped to integers in the order of the floats they encode (so a difference counts ULPs)."""
    sign = 1 << (width - 1)
    out = []
    for v in b:
        v &= (1 << width) - 1
        out.append(-(v & (sign - 1)) if v & sign else v)
    return out


def ulps(a: dict, b: dict) -> tuple[int, int]:
    """(elements that differ, the largest distance in units in the last place) between two :func:`bits`."""
    if a.get("dtype") != b.get("dtype"):
        return -1, -1
    if "values" in a or "values" in b:
        diff = [abs(x - y) for x, y in zip(a.get("values", []), b.get("values", []))]
        return sum(d != 0 for d in diff), int(max(diff, default=0))
    width = torch.finfo(DTYPES[a["dtype"]]).bits
    x, y = _ordered(a["bits"], width), _ordered(b["bits"], width)
    if len(x) != len(y):
        return -1, -1
    diff = [abs(p - q) for p, q in zip(x, y)]
    return sum(d != 0 for d in diff), max(diff, default=0)


def compare_across(name: str, per_rank: dict, groups: Sequence[Sequence[int]]) -> Optional[Metric]:
    """A failing :class:`Metric` if the ranks of some group hold different bits of ``name``, else None."""
    for group in groups:
        present = [r for r in group if per_rank.get(r) is not None]
        if len(present) < 2:
            continue
        first = present[0]
        for r in present[1:]:
            if per_rank[r] == per_rank[first]:
                continue  # the same bits (the common case, compared without a Python loop over elements)
            n, worst = ulps(per_rank[first], per_rank[r])
            if n == 0:
                continue
            if n < 0:
                what = f"rank {first} has {per_rank[first].get('dtype')}, rank {r} {per_rank[r].get('dtype')}"
            else:
                unit = "ULPs" if "bits" in per_rank[first] else "counts"
                what = f"{n} element{'s' if n != 1 else ''} differ, by up to {worst} {unit}"
            return Metric.failure(f"{name} differs across ranks: rank {first} vs rank {r}: {what} (a correct "
                                  "SyncBN computes it identically on every rank of a group)")
    return None
