"""The two in-process timers of the benchmarks: wall time on CPU, CUDA events on a GPU.

Both return the median of ``repeat`` calls after ``warmup`` untimed ones: these
machines are noisy, and a figure is only ever compared with a baseline measured
by the same timer in the same run. Whole commands are timed by
:func:`harness.bench.commands.time_command`, in child processes.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


def median_time(fn: Callable[[], object], *, repeat: int = 7, warmup: int = 2) -> float:
    """Median wall time of ``fn()`` in seconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cuda_median_time(fn: Callable[[], object], *, repeat: int = 20, warmup: int = 3) -> float:
    """Median time of ``fn()`` in seconds between CUDA events on the current stream."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)
