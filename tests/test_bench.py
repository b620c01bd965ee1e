"""The benchmarks run (their figures are for people; here only that they work and say what they measure)."""

from __future__ import annotations

import pytest

from harness import bench, catalog


def test_pool_benchmark_cases_exist():
    assert len(catalog.select(list(bench.POOL_CASES))) == len(bench.POOL_CASES)


@pytest.mark.slow
def test_pool_benchmark_reports_a_ratio():
    lines = []
    figures = bench.bench_pool(cases=6, fresh_cases=1, echo=lines.append)
    assert figures["fresh_ms"] > 0 and figures["warm_ms"] > 0
    assert figures["speedup"] == pytest.approx(figures["fresh_ms"] / figures["warm_ms"])
    assert any("speed-up" in line for line in lines)
