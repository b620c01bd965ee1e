"""The CUDA parts the GPU suite runs, checked on their CPU side: the decisions they rest on, without a GPU.

The suite itself (its plan, runner, packing and offline rehearsal) is tested by
the other files of this folder. On a machine without a GPU (every machine these tests
normally run on): the cuda-marked tests are collected and skipped with the reason;
nccl's one-GPU-per-rank decision and the ranks' GPU choice are pure functions;
the cuda-graph cases are unsupported at once on CPU, over gloo and for the
reference; the benchmark's arithmetic is exact and its whole code path runs on
CPU through the torch emulation; `bench kernels --device cuda` is a usage error
that names the fix. On a GPU (the cuda-marked tests at the end): the CUDA
timer measures GPU time, and the cuda_graph scenario's warm-up, restore,
capture and replay match the oracle on one rank (what the multi-GPU cases
rest on), while the reference really cannot be captured.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_here import run_here
import torch

from harness import catalog
from harness.bench import device_kernels, timing
from harness.engine.rank import gpu_index
from harness.engine.session import RunOptions, Session, gpu_shortage, resolve_impls
from harness.impls import resolve
from harness.judge.status import Status
from harness.scenarios import unsupported_reason

ROOT = Path(__file__).resolve().parents[2]
no_gpu_here = pytest.mark.skipif(torch.cuda.is_available(), reason="checks what happens where torch sees no GPU")


def test_a_report_of_records_that_compared_nothing_has_numeric_metrics():
    """A store of skipped records only (the GPU suite on a machine without one) still gets its report."""
    from harness.results.frames import metrics_frame
    from harness.results.plots import plottable

    frame = metrics_frame([])
    assert all(frame[c].dtype == float for c in ("max_abs_err", "max_rel_err", "tol", "ratio"))
    assert plottable(frame).empty


# ---------------------------------------------------------------------- the cuda-marked tests


@no_gpu_here
@pytest.mark.slow(15)
def test_the_cuda_tests_are_collected_and_skipped_with_the_reason():
    target = str(ROOT / "tests" / "kernels" / "test_cuda_kernels.py")
    base = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", target]
    # One verbose run lists every collected cuda test with its outcome, and the skip reasons.
    ran = subprocess.run(base + ["-m", "cuda", "-vv", "-rs"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    tests = [line for line in ran.stdout.splitlines() if "::" in line and not line.startswith("SKIPPED")]
    n = len(tests)
    assert n >= 40, ran.stdout
    assert all(line.split()[1] == "SKIPPED" for line in tests), ran.stdout
    assert f"{n} skipped" in ran.stdout and "passed" not in ran.stdout and "failed" not in ran.stdout, ran.stdout
    unmarked = subprocess.run(base + ["-m", "not cuda", "--collect-only"], cwd=ROOT, capture_output=True, text=True,
                              timeout=300)
    assert unmarked.returncode == 5, unmarked.stdout  # no test there runs without the cuda marker
    assert "needs a CUDA device" in ran.stdout and "`syncbn-harness gpu-suite` runs these" in ran.stdout


# ---------------------------------------------------------------------- the engine's decisions


@pytest.mark.parametrize("device,backend,world_size,gpus,reason", [
    ("cpu", "gloo", 4, 0, None),
    ("cuda", "gloo", 4, 1, None),  # gloo: ranks share the GPU
    ("cuda", "nccl", 2, 2, None),
    ("cuda", "nccl", 2, 8, None),
    ("cuda", "nccl", 2, 1, "nccl needs one GPU per rank: 1 visible, the case has 2 ranks"),
    ("cuda", "nccl", 4, 3, "nccl needs one GPU per rank: 3 visible, the case has 4 ranks"),
])
def test_nccl_needs_a_gpu_per_rank(device, backend, world_size, gpus, reason):
    got = gpu_shortage(device, backend, world_size, gpus)
    assert (got is None) == (reason is None) and (reason is None or got.startswith(reason)), got
    if got:
        assert "--backend gloo" in got  # and says what to do instead


def test_ranks_take_gpus_round_robin():
    assert gpu_index(3, "cpu", 0) is None
    assert [gpu_index(r, "cuda", 1) for r in range(4)] == [0, 0, 0, 0]
    assert [gpu_index(r, "cuda", 2) for r in range(4)] == [0, 1, 0, 1]
    assert [gpu_index(r, "cuda", 8) for r in range(4)] == [0, 1, 2, 3]
    with pytest.raises(RuntimeError, match="sees no GPU"):
        gpu_index(0, "cuda", 0)


# ---------------------------------------------------------------------- the cuda-graph family


def graph_cases():
    return catalog.select(["cuda-graph/*"], exhaustive=True)


def test_the_cuda_graph_cases_are_outside_the_default_selection_and_capturable():
    cases = graph_cases()
    assert len(cases) == 3 and not any(c.family == "cuda-graph" for c in catalog.select())
    for c in cases:
        assert c.scenario == "cuda_graph" and not c.default
        assert set(c.steps) == {"train"} and len(c.steps) >= 2  # replayed more than once
        assert c.momentum is not None  # momentum=None reads num_batches_tracked on the host: no capture
    assert any(0 in c.batch_sizes for c in cases)  # a zero count under capture (pytorch#78656)


def test_which_cuda_graph_runs_can_happen():
    case, layer = graph_cases()[0], catalog.select(["numerics/offset-1e3/ws2"])[0]
    torch_impl, reference = resolve("torch"), resolve("reference")
    assert "--device cuda" in unsupported_reason(case, torch_impl, "cpu", "gloo")
    assert "--backend nccl" in unsupported_reason(case, torch_impl, "cuda", "gloo")
    assert unsupported_reason(case, torch_impl, "cuda", "nccl") is None
    assert unsupported_reason(case, reference, "cuda", "nccl") is None  # its training step syncs nothing
    from types import SimpleNamespace

    from harness.impls.base import Capabilities

    no_capture = SimpleNamespace(name="no-capture", capabilities=Capabilities(graph_capture=False))
    assert "graph_capture=False" in unsupported_reason(case, no_capture, "cuda", "nccl")
    assert unsupported_reason(layer, torch_impl, "cpu", "gloo") is None  # the layer scenario asks nothing


def test_the_cuda_graph_cases_are_unsupported_on_cpu_at_once():
    impls = resolve_impls(["reference", "torch"])
    session = Session(impls, RunOptions(device="cpu"))
    t0 = time.perf_counter()
    try:
        records = [session.run_one(c, i) for c in graph_cases() for i in impls]
    finally:
        session.close(kill=True)
    assert time.perf_counter() - t0 < 5 and not session.pools  # no rank was started
    assert {r.status for r in records} == {Status.UNSUPPORTED}
    assert all("needs --device cuda" in r.message for r in records), [r.message for r in records]


# ---------------------------------------------------------------------- bench kernels --device cuda


def test_bench_figures_are_ratios_of_the_measured_times():
    times = {"copy": 1.0, "reference welford_stats": 1.0, "reference fwd+bwd": 3.0, "torch fwd+bwd": 2.0}
    for i, op in enumerate(device_kernels.OPS):
        times[f"reference {op}"], times[f"torch {op}"] = 1.0 + i, 0.5
    f = device_kernels.derive(times, nbytes=10**9, peak=4.0)
    assert f["copy_gbps"] == 2.0 and f["stats_gbps"] == 1.0  # a copy moves the bytes twice
    assert f["stats_over_copy_bandwidth"] == 0.5 and f["stats_over_peak_bandwidth"] == 0.25
    assert [f["ops"][op]["reference_over_torch"] for op in device_kernels.OPS] == [2.0, 4.0, 6.0, 8.0]
    assert f["ops"]["welford_stats"]["reference_over_torch"] == 2.0  # against torch's batch_norm_stats
    assert f["ops"]["batch_norm_stats"]["reference_ms"] == 1000.0
    assert f["reference_over_torch"] == 1.5
    assert device_kernels.derive(times, nbytes=10**9)["stats_over_peak_bandwidth"] is None


def test_peak_bandwidth_from_clock_and_bus_width():
    # H100 SXM: HBM3 at 2619 MHz on a 5120-bit bus, 3.35 TB/s.
    assert math.isclose(device_kernels.peak_gb_per_s(2_619_000, 5120), 3352.32)
    assert device_kernels.peak_gb_per_s(None, 5120) is None and device_kernels.peak_gb_per_s(2_619_000, 0) is None


@pytest.mark.slow
def test_the_cuda_bench_code_runs_end_to_end_on_cpu_through_the_emulation():
    """Every line of the CUDA benchmark but the CUDA timer, on CPU: torch's five ops get the reference CPU kernels
    (the torch emulation), so the figures are real numbers but say nothing of the GPU."""
    code = (
        "import json, torch\n"
        "from harness.impls import torch_emulation\n"
        "torch_emulation.install()\n"
        "from harness.bench.device_kernels import bench_device_kernels\n"
        "shapes = [('s', (4, 6, 5, 3), torch.float16, torch.channels_last),"
        " ('t', (3, 5, 4), torch.float32, torch.contiguous_format)]\n"
        "lines = []\n"
        "figs = bench_device_kernels('cpu', repeat=2, echo=lines.append, shapes=shapes)\n"
        "print(json.dumps({'figures': figs, 'lines': lines}))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [f["shape"] for f in out["figures"]] == ["s", "t"]
    for f in out["figures"]:
        assert set(f["ops"]) == {*device_kernels.OPS, device_kernels.GATHER, "welford_stats"}
        assert all(row["reference_over_torch"] > 0 for row in f["ops"].values())
        assert f["stats_over_copy_bandwidth"] > 0 and f["reference_over_torch"] > 0 and f["peak_gbps"] is None
    assert any(line.startswith("  statistics pass (welford_stats):") for line in out["lines"])


@no_gpu_here
def test_bench_kernels_on_cuda_without_a_gpu_names_the_fix():
    proc = run_here(["bench", "kernels", "--device", "cuda"])  # in this process (tests/support/cli_here.py)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--device cuda" in proc.stderr and "sees no CUDA device" in proc.stderr
    assert "gpu-suite" in proc.stderr and "use --device cpu" in proc.stderr


# ---------------------------------------------------------------------- on a GPU


@pytest.mark.cuda
def test_the_cuda_timer_measures_gpu_time():
    cycles = 50_000_000  # tens of ms of GPU time, launched in microseconds
    t = timing.cuda_median_time(lambda: torch.cuda._sleep(cycles), repeat=3, warmup=1)
    rate_khz = getattr(torch.cuda.get_device_properties(0), "clock_rate", None) or 2_000_000
    assert t > 0.2 * cycles / (rate_khz * 1e3), t


def one_rank_graph_case():
    from harness.catalog.case import Case

    return Case(id="cuda-graph/one-rank/ws1", family="cuda-graph", batch_sizes=(5,), spatial=((4, 3),),
                steps=("train", "train"), scenario="cuda_graph", default=False)


@pytest.mark.cuda
def test_one_rank_captured_and_replayed_matches_the_oracle():
    """No process group: torch's SyncBatchNorm runs plain batch_norm, captured and replayed with new inputs."""
    from harness.engine.messages import RankResult
    from harness.engine.rank import RankContext
    from harness.scenarios import cuda_graph

    result = RankResult(rank=0)
    cuda_graph.run_rank(RankContext(0, 1), one_rank_graph_case(), resolve("torch"), "cuda", result)
    assert any(name.startswith("step1.") for name in result.metrics)  # the second replay was judged
    bad = {name: m.describe() for name, m in result.metrics.items() if not m.ok}
    assert not bad, bad


@pytest.mark.cuda
def test_the_reference_captured_and_replayed_matches_the_oracle():
    """What its capabilities say (graph_capture=True): no host read in its training step, so the scenario captures
    and replays it, judged like torch's."""
    from harness.engine.messages import RankResult
    from harness.engine.rank import RankContext
    from harness.scenarios import cuda_graph

    result = RankResult(rank=0)
    cuda_graph.run_rank(RankContext(0, 1), one_rank_graph_case(), resolve("reference"), "cuda", result)
    assert any(name.startswith("step1.") for name in result.metrics)
    bad = {name: m.describe() for name, m in result.metrics.items() if not m.ok}
    assert not bad, bad
