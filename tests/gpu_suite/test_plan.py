"""The GPU suite's plan: its steps in order of value, their limits, and the command line that shows them.

Design: :func:`harness.gpu_suite.steps.plan` is pure, so the order, the limits and what each step runs are
checked on any machine; ``gpu-suite --plan`` and ``nox -s gpu`` are run as a user runs them (real processes),
here where there is no GPU: the plan prints, the suite fails with the reason and never skips.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cli_here import run_here

from harness.gpu_suite.steps import (DEFAULT_BUDGET_S, KILL_AFTER_S, REPORT_RESERVE_S, Inputs, plan,
                                     step_limit)

ROOT = Path(__file__).resolve().parents[2]


def inputs(tmp_path, **kw):
    base = dict(work=tmp_path / "work", arch="9.0", gpus=1, python="py", tests=ROOT / "tests")
    return Inputs(**{**base, **kw})


def test_the_steps_come_in_order_of_value(tmp_path):
    steps = plan(inputs(tmp_path, apex_src=tmp_path / "apex", apex_pythonpath="A:B", emulated=tmp_path / "emu",
                        repros=(tmp_path / "r1.py", tmp_path / "r2.py")))
    names = [s.name for s in steps]
    assert names == ["build-kernels", "build-apex", "pytest -m cuda", "bench kernels", "layer cases, gloo",
                     "layer cases, gloo, apex", "training systems, gloo", "repro r1.py", "repro r2.py", "fidelity",
                     "report"]
    by = {s.name: s for s in steps}
    assert by["build-kernels"].required and by["build-kernels"].argv[-2:] == ("--cuda-arch", "9.0")
    assert by["build-apex"].early  # needs no GPU: it compiles while the reference kernels do
    assert by["report"].closing
    assert by["repro r1.py"].ok_exits == (0, 1)  # a repro's exit 1 is its verdict, not a failed step
    run = by["layer cases, gloo"].argv
    assert run[:3] == ("py", "-m", "harness") and "--no-diagnose" in run
    assert run[run.index("--device") + 1] == "cuda" and run[run.index("--backend") + 1] == "gloo"
    assert run[run.index("--store") + 1] == str(tmp_path / "work" / "results")
    assert "--scenario" in run and "compile/*" not in run  # inductor's CUDA compiles do not fit the budget
    assert by["layer cases, gloo, apex"].env == {"PYTHONPATH": "A:B"}
    assert by["bench kernels"].stdout == "bench.json"
    assert "--impl" in by["fidelity"].argv and str(tmp_path / "emu") in by["fidelity"].argv
    assert len({s.log for s in steps}) == len(steps) and all("/" not in s.log for s in steps)


def test_nccl_and_cuda_graph_steps_need_two_gpus(tmp_path):
    one = [s.name for s in plan(inputs(tmp_path))]
    two = [s.name for s in plan(inputs(tmp_path, gpus=2))]
    assert not any("nccl" in n for n in one)
    assert "layer cases, nccl" in two and "cuda-graph family, nccl" in two
    assert "build-apex" not in one and "fidelity" not in one  # only with an apex checkout, emulated records


def test_an_installed_copy_without_tests_skips_pytest(tmp_path):
    assert "pytest -m cuda" not in [s.name for s in plan(inputs(tmp_path, tests=None))]


def test_the_budget_always_leaves_time_for_the_report(tmp_path):
    steps = plan(inputs(tmp_path))
    build, report = steps[0], steps[-1]
    assert step_limit(build, 10_000) == build.limit_s
    assert step_limit(build, 200) == 200 - REPORT_RESERVE_S - KILL_AFTER_S
    assert step_limit(build, REPORT_RESERVE_S) == 0  # not started: the rest is the report's
    assert step_limit(report, 0) == REPORT_RESERVE_S and step_limit(report, 10_000) == report.limit_s
    assert DEFAULT_BUDGET_S + 60 + KILL_AFTER_S <= 600  # the wrapper's limit fits one lent command


def test_plan_prints_the_steps_and_runs_nothing(tmp_path):
    proc = run_here(["gpu-suite", "--plan", "--out", str(tmp_path / "out")])  # in this process (cli_here.py)
    assert proc.returncode == 0, proc.stderr
    for name in ("build-kernels", "pytest -m cuda", "bench kernels", "layer cases, gloo", "report"):
        assert any(line.startswith(name + " (") for line in proc.stdout.splitlines()), proc.stdout
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks a machine without a GPU")
def test_nox_gpu_fails_where_the_suite_cannot_run(tmp_path):
    """Never a silent skip with exit 0: no GPU (or a CPU build of torch) is a failure that says why."""
    proc = subprocess.run([sys.executable, "-m", "nox", "-s", "gpu", "--", "--out", str(tmp_path / "out")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text
    assert "cannot run here" in text and ("CPU-only build" in text or "sees no GPU" in text), text
    assert "exit code 3" in text
    packed = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert {"console.txt", "machine.json", "summary.md", "suite.tar.gz"} <= set(packed), packed


def test_the_layer_cases_are_every_default_layer_family_but_compile():
    from harness import catalog
    from harness.gpu_suite.steps import layer_selection

    flags = layer_selection()
    families = {flags[i + 1].split("/")[0] for i, f in enumerate(flags) if f == "--case"}
    assert families == {c.family for c in catalog.select(scenarios=["layer"])} - {"compile"}
    chosen = catalog.select([flags[i + 1] for i, f in enumerate(flags) if f == "--case"], scenarios=["layer"])
    assert chosen and all(c.scenario == "layer" and c.family != "compile" for c in chosen)


def test_the_training_systems_are_every_default_non_layer_family_but_compile():
    from harness import catalog
    from harness.gpu_suite.steps import system_selection

    flags = system_selection()
    cases = [flags[i + 1] for i, f in enumerate(flags) if f == "--case"]
    scenarios = [flags[i + 1] for i, f in enumerate(flags) if f == "--scenario"]
    chosen = catalog.select(cases, scenarios=scenarios)
    want = [c for c in catalog.select() if c.scenario != "layer" and c.family != "compile"]
    assert {c.id for c in chosen} == {c.id for c in want} and want
