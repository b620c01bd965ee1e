"""The benchmarks run (their figures are for people; here only that they work and say what they measure)."""

from __future__ import annotations

import pytest

from harness import catalog
from harness.bench import pool


def test_pool_benchmark_cases_exist():
    assert len(catalog.select(list(pool.POOL_CASES))) == len(pool.POOL_CASES)


@pytest.mark.slow
def test_pool_benchmark_reports_a_ratio():
    lines = []
    figures = pool.bench_pool(cases=12, fresh_cases=1, echo=lines.append)
    # What the pool is for: a case in a warm pool, its start-up shared by 12 cases, costs a fraction of a case in a
    # fresh process group (spawn, import torch, rendezvous each time). Measured at 176x with 300 cases.
    assert figures["speedup"] > 2, figures
    assert lines[-1] == f"speed-up: {figures['speedup']:.0f}x"


def test_every_command_of_bench_run_parses_with_this_cli(tmp_path):
    """A figure whose command line this CLI refuses would only show up as a failed bench, at the end of it."""
    import click

    from harness.bench import commands as bench_commands
    from harness.commands import cli, load_commands
    from harness.commands.bench import FIGURE_NAMES

    assert FIGURE_NAMES == bench_commands.FIGURES
    load_commands()
    for name in bench_commands.FIGURES:
        args = [a.replace("{store}", str(tmp_path)) for a in bench_commands.figure_args(name)]
        command = cli.commands[args[0]]
        with click.Context(command) as ctx:  # parsing only: nothing runs
            command.parse_args(ctx, args[1:])


def test_every_scaling_implementation_resolves(monkeypatch):
    from harness.bench import commands as bench_commands
    from harness.impls import resolve_impls

    assert len(bench_commands.SCALING_IMPLS) == 10
    assert [i.name for i in resolve_impls(list(bench_commands.SCALING_IMPLS))] == list(bench_commands.SCALING_IMPLS)


@pytest.mark.slow
def test_bench_run_times_this_tree_against_an_exported_commit(tmp_path):
    """Against HEAD of this checkout: the commit is exported, run from there (not from this tree), removed."""
    import subprocess
    import sys
    import tempfile

    from harness.bench import commands as bench_commands

    root = bench_commands.repository_root(bench_commands.Path(bench_commands.__file__).parent)
    if not (root / ".git").exists():
        pytest.skip("not a git checkout")
    tree = bench_commands.export_baseline(root, "HEAD", tmp_path)
    probe = subprocess.run([sys.executable, "-c", "import harness, harness.kernels, harness.cases; "
                            "print(harness.__file__, harness.kernels.__file__, harness.cases.__file__)"],
                           env={**bench_commands.os.environ, **tree.env}, cwd=tmp_path, capture_output=True, text=True,
                           timeout=120)
    assert probe.returncode == 0, probe.stderr
    assert all(p.startswith(str(tree.root)) for p in probe.stdout.split()), probe.stdout
    lines: list[str] = []
    before = set(bench_commands.Path(tempfile.gettempdir()).glob("syncbn-bench-*"))
    # This tree is the checkout's root: its harness package first on the path, nothing of it shadowing the
    # standard library (the package folder itself on the path makes harness/bisect shadow bisect).
    assert (bench_commands.ROOT / "pyproject.toml").exists() and (bench_commands.ROOT / "harness").is_dir()
    rows = bench_commands.bench_run("HEAD", ("startup",), repeat=1, warmup=False, echo=lines.append)
    assert rows[0]["figure"] == "startup" and rows[0]["ratio"] > 0
    assert lines[1].startswith("startup") and "ratio" in lines[1]
    assert set(bench_commands.Path(tempfile.gettempdir()).glob("syncbn-bench-*")) == before


def test_the_next_command_waits_until_the_last_one_left_nothing_running():
    """A command that returns while a process it started still runs (a forkserver's teardown, say): the bench
    waits for that process, untimed, before timing anything else; past the limit it kills it."""
    import subprocess
    import time

    from harness.bench.commands import await_quiet
    from harness.procs import in_session as _running_in

    proc = subprocess.Popen(["bash", "-c", "sleep 1 & exit 0"], start_new_session=True)
    proc.wait(timeout=30)
    assert _running_in(proc.pid)  # the sleep outlives the command
    t0 = time.monotonic()
    await_quiet(proc.pid)
    assert 0.3 < time.monotonic() - t0 < 30 and not _running_in(proc.pid)

    proc = subprocess.Popen(["bash", "-c", "sleep 60 & exit 0"], start_new_session=True)
    proc.wait(timeout=30)
    await_quiet(proc.pid, timeout=0.5)
    deadline = time.monotonic() + 10
    while _running_in(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running_in(proc.pid)


def test_a_search_figure_reads_the_rate_the_search_reports(tmp_path):
    """The rate comes from the search's own summary line (exploring only), in this tree's real output."""
    from harness.bench import commands as bench_commands

    tree = bench_commands.Tree("this tree", bench_commands.ROOT, bench_commands.python_path(bench_commands.ROOT))
    args = bench_commands.figure_args("search")
    args[args.index("--max-cases") + 1] = "4"
    elapsed, rate = bench_commands.time_command(tree, args, tmp_path)
    assert elapsed > 0 and rate is not None and 0 < rate < 1000, (elapsed, rate)
    _, none = bench_commands.time_command(tree, ["list", "impls"], tmp_path)
    assert none is None


def test_the_cuda_benchmark_measures_what_syncbn_users_run():
    """ResNet-50's batch-norm layers at N16 and N2 in both layouts and 2-D input, in float32, float16 and bfloat16."""
    import torch

    from harness.bench.device_kernels import CUDA_SHAPES

    labels = [s[0] for s in CUDA_SHAPES]
    assert len(labels) == len(set(labels)) == 3 * (2 * 5 * 2 + 3)
    assert {s[2] for s in CUDA_SHAPES} == {torch.float32, torch.float16, torch.bfloat16}
    assert ("N16 C256 56x56 float16 channels_last", (16, 256, 56, 56), torch.float16,
            torch.channels_last) in CUDA_SHAPES
    assert all(len(s[1]) == 4 or s[3] == torch.contiguous_format for s in CUDA_SHAPES)  # 2-D: contiguous only
    assert all(2 <= s[1][0] <= 16 and s[1][1] <= 2048 for s in CUDA_SHAPES)


def test_a_shape_meets_the_goal_when_every_op_and_the_bandwidth_do():
    from harness.bench.device_kernels import GATHER, OPS, derive

    # stats / copy bandwidth = (bytes / t_stats) / (2 bytes / t_copy): 0.6 at t_stats = t_copy / 1.2.
    times = {"copy": 1.0, "reference welford_stats": 1 / 1.2, "torch batch_norm_stats": 3.0,
             "reference fwd+bwd": 3.0, "torch fwd+bwd": 2.0, "reference sequence": 2.2, "torch sequence": 2.0}
    for op in OPS + (GATHER,):
        times[f"reference {op}"], times[f"torch {op}"] = 1.2, 1.0
    f = derive(times, nbytes=10**9)
    assert f["stats_over_copy_bandwidth"] == pytest.approx(0.6) and f["meets_goal"]
    assert set(f["ops"]) == {*OPS, GATHER, "welford_stats"} and f["sequence_over_torch"] == pytest.approx(1.1)
    times[f"reference {GATHER}"] = 1.21
    assert not derive(times, nbytes=10**9)["meets_goal"]
    times[f"reference {GATHER}"], times["reference welford_stats"] = 1.2, 1 / 1.18
    assert not derive(times, nbytes=10**9)["meets_goal"]
