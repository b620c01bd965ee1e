"""Batch slices: large tensors are generated, reduced and compared a slice at a time.

A rank's tensors at real network sizes hold millions of values, and every
float64 pass over a whole one streams tens of megabytes through memory, which
the ranks of a case share. Cut along the batch (the outermost dimension in
every memory format, so each slice is one block of memory), a slice of at most
:data:`CHUNK` elements keeps a computation's float64 temporaries in the cache.

Protocol: :func:`batch_slices` yields ``(a, b)`` bounds whose ``x[a:b]`` cover
``x`` in order, at least one sample each; nothing for an empty batch. Results
must not depend on the slicing beyond the order of float64 additions in sums.
"""

from __future__ import annotations

from typing import Iterator, Optional

import torch

CHUNK = 1 << 18  # elements (2 MiB in float64)


def batch_slices(x: torch.Tensor, chunk: Optional[int] = None) -> Iterator[tuple[int, int]]:
    """``x`` cut along its first dimension into slices of at most ``chunk`` (default :data:`CHUNK`) elements,
    one sample at least."""
    chunk = chunk or CHUNK
    per_sample = max(x[0].numel(), 1) if x.shape[0] else 1
    step = max(1, chunk // per_sample)
    for a in range(0, x.shape[0], step):
        yield a, min(a + step, x.shape[0])
