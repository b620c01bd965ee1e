"""The benchmarks run (their figures are for people; here only that they work and say what they measure)."""

from __future__ import annotations

import pytest

from harness import bench, catalog


def test_pool_benchmark_cases_exist():
    assert len(catalog.select(list(bench.POOL_CASES))) == len(bench.POOL_CASES)


@pytest.mark.slow
def test_pool_benchmark_reports_a_ratio():
    lines = []
    figures = bench.bench_pool(cases=12, fresh_cases=1, echo=lines.append)
    # What the pool is for: a case in a warm pool, its start-up shared by 12 cases, costs a fraction of a case in a
    # fresh process group (spawn, import torch, rendezvous each time). Measured at 176x with 300 cases.
    assert figures["speedup"] > 2, figures
    assert lines[-1] == f"speed-up: {figures['speedup']:.0f}x"
