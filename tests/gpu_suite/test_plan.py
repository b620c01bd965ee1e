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
                        repros=(tmp_path / "r1.py", tmp_path / "r2.py"), ncu="/opt/ncu", nccl=(2, 28, 9)))
    names = [s.name for s in steps]
    assert names == ["build-kernels", "build-apex", "pytest -m cuda", "bench kernels",
                     "layer cases, gloo", "layer cases, gloo, apex", "repros", "nccl two ranks on one GPU",
                     "training systems, gloo", "training systems, gloo, apex", "compile cases, gloo", "ncu profile",
                     "layer cases, nccl", "cuda-graph family, nccl", "fidelity", "report"]
    by = {s.name: s for s in steps}
    assert by["build-kernels"].required and by["build-kernels"].argv[-2:] == ("--cuda-arch", "9.0")
    assert by["build-apex"].early  # needs no GPU: it compiles while the reference kernels do
    assert by["report"].closing
    assert by["bench kernels"].exclusive and by["ncu profile"].exclusive  # they time things: alone on the machine
    # Two waves side by side: the layer cases with apex's, the repros and the NCCL probe; the training systems
    # with apex's and the compile cases.
    assert [n for n in names if by[n].with_previous] == ["layer cases, gloo, apex", "repros",
                                                         "nccl two ranks on one GPU", "training systems, gloo, apex",
                                                         "compile cases, gloo", "cuda-graph family, nccl"]
    assert by["nccl two ranks on one GPU"].ok_exits == (0, 1)  # a refusal is an answer, not a failed step
    run = by["layer cases, gloo"].argv
    assert run[:3] == ("py", "-m", "harness") and "--no-diagnose" in run
    assert run[run.index("--device") + 1] == "cuda" and run[run.index("--backend") + 1] == "gloo"
    assert run[run.index("--store") + 1] == str(tmp_path / "work" / "results")
    assert "--scenario" in run and "compile/*" not in run  # inductor's CUDA compiles do not fit the budget
    for apex in ("layer cases, gloo, apex", "training systems, gloo, apex"):
        assert by[apex].env == {"PYTHONPATH": "A:B"} and by[apex].needs == ("build-apex",)
    assert by["repros"].argv[by["repros"].argv.index("--apex-path") + 1] == "A:B"  # apex's files find apex
    assert by["repros"].argv[-2:] == (str(tmp_path / "r1.py"), str(tmp_path / "r2.py"))
    assert by["bench kernels"].stdout == "bench.json"
    assert "--impl" in by["fidelity"].argv and str(tmp_path / "emu") in by["fidelity"].argv
    assert "cpu-emulation" not in names  # brought along: not made again
    assert len({s.log for s in steps}) == len(steps) and all("/" not in s.log for s in steps)
    assert not [s.name for s in steps if s.skip and s.name not in ("layer cases, nccl", "cuda-graph family, nccl")]


def test_what_cannot_run_here_is_planned_as_not_run_with_the_reason(tmp_path):
    """No apex checkout, no ncu, one GPU with an NCCL that refuses two ranks on it: said, and the rest runs."""
    steps = plan(inputs(tmp_path, apex_missing="--apex-src /x: not an apex checkout", nccl=(2, 28, 9)))
    by = {s.name: s for s in steps}
    skipped = {s.name: s.skip for s in steps if s.skip}
    assert set(skipped) == {"build-apex", "layer cases, gloo, apex", "training systems, gloo, apex", "ncu profile",
                            "layer cases, nccl", "cuda-graph family, nccl"}
    assert skipped["build-apex"] == skipped["layer cases, gloo, apex"] == "--apex-src /x: not an apex checkout"
    assert "ncu" in skipped["ncu profile"]
    assert "NCCL 2.28.9" in skipped["layer cases, nccl"] and "NCCL_MULTI_RANK_GPU_ENABLE" in skipped[
        "layer cases, nccl"]
    assert not by["nccl two ranks on one GPU"].skip  # the probe runs: the refusal is the evidence
    # cpu-emulation of the same cases on this machine's CPUs (the same torch build), started with the layer wave
    emu = by["cpu-emulation"]
    assert emu.starts_with == "pytest -m cuda" and "--prepare-emulated" in emu.argv
    assert by["fidelity"].needs == ("cpu-emulation",) and str(tmp_path / "work" / "emulated") in by["fidelity"].argv
    assert [s.name for s in steps].index("cpu-emulation") < [s.name for s in steps].index("fidelity")


def test_nccl_families_run_with_a_gpu_per_rank(tmp_path):
    two = {s.name: s for s in plan(inputs(tmp_path, gpus=2, nccl=(2, 28, 9)))}
    assert not two["layer cases, nccl"].skip and not two["cuda-graph family, nccl"].skip


def test_an_installed_copy_without_tests_does_not_run_pytest(tmp_path):
    by = {s.name: s for s in plan(inputs(tmp_path, tests=None))}
    assert "no tests/ folder" in by["pytest -m cuda"].skip


def test_the_compile_cases_exist_and_cover_three_backends():
    from harness import catalog
    from harness.gpu_suite.steps import COMPILE_CASES

    cases = catalog.select(list(COMPILE_CASES))
    assert [c.id for c in cases] == list(COMPILE_CASES)
    assert {c.id.split("/")[2] for c in cases} == {"eager", "aot_eager", "inductor"}


def test_a_folder_of_repros_runs_every_file_in_it(tmp_path):
    from harness.gpu_suite import repro_files

    (tmp_path / "b.py").write_text("")
    (tmp_path / "a.py").write_text("")
    (tmp_path / "notes.md").write_text("")
    one = tmp_path / "x" / "c.py"
    one.parent.mkdir()
    one.write_text("")
    assert repro_files((tmp_path, one)) == (tmp_path / "a.py", tmp_path / "b.py", one)


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
    assert "build-apex (not run: no apex checkout given (--apex-src))" in proc.stdout
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


def test_the_next_gpu_run_takes_the_loss_scaling_fsdp2_two_forward_and_list_backend_cases():
    """Picked by family, so the GPU's first look at them needs no change here: torch's half partial sums under
    scaled gradients (pytorch#195701) on its real kernel, a GradScaler, FSDP2 and DDP's two forwards on CUDA."""
    from harness import catalog
    from harness.gpu_suite.steps import layer_selection, system_selection

    def chosen(flags):
        def given(flag):
            return [flags[i + 1] for i, f in enumerate(flags) if f == flag]

        return {c.id for c in catalog.select(given("--case"), scenarios=given("--scenario") or None)}

    layers = chosen(layer_selection())
    systems = chosen(system_selection())
    assert {"mixed-precision/scaled-grads/float16-float32/ws2",
            "mixed-precision/scaled-grads-channels-last/float16-float32/ws2",
            "allgather-shape/even-4-4/float32-float32/contiguous/ws2/list-contract"} <= layers
    assert {"autocast/grad-scaler/cnn/ddp/loss-2-10/uneven-8-6/ws2", "fsdp/cnn-sgd/bfloat16/uneven-3-5/ws2",
            "ddp/cnn-sgd/broadcast-buffers-True-default-two-forwards/float32/ws2",
            "ddp/cnn-sgd/broadcast-buffers-True-default-plain/float32/ws2/list-contract"} <= systems


def test_every_harness_command_of_the_plan_parses_with_this_cli(tmp_path):
    """A step whose command line this CLI refuses would only show on the GPU machine, as a failed step."""
    import click

    from harness.commands import cli, load_commands

    load_commands()
    for made_by_earlier_steps in ("apex", "work/emulated", "work/results"):
        (tmp_path / made_by_earlier_steps).mkdir(parents=True)
    steps = plan(inputs(tmp_path, apex_src=tmp_path / "apex", apex_pythonpath="A", repros=(tmp_path / "r.py",),
                        ncu="/opt/ncu", nccl=(2, 30, 1), gpus=2))
    checked = 0
    for step in steps:
        if step.argv[1:3] != ("-m", "harness"):
            continue
        command = cli.commands[step.argv[3]]
        with click.Context(command) as ctx:  # parsing only: nothing runs
            command.parse_args(ctx, list(step.argv[4:]))
        checked += 1
    assert checked >= 12
    modules = [s.argv[2] for s in steps if s.argv[1] == "-m" and s.argv[2].startswith("harness.gpu_suite.")]
    assert sorted(modules) == ["harness.gpu_suite.nccl_probe", "harness.gpu_suite.profile",
                               "harness.gpu_suite.repros"]
    for name in modules:  # the suite's own modules exist and have a main
        assert callable(__import__(name, fromlist=["main"]).main)


def test_the_harness_commit_is_the_callers_where_given_else_gits(monkeypatch, tmp_path):
    """A copy on a lent machine carried a .git naming the session's first commit (2026-11-28): the commit the
    caller gives wins; without one, this checkout's git is read."""
    from harness.gpu_suite.machine import CLEAN_ENV, COMMIT_ENV, Provenance, provenance

    monkeypatch.delenv(COMMIT_ENV, raising=False)
    monkeypatch.delenv(CLEAN_ENV, raising=False)
    here = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert (provenance(ROOT).commit, provenance(ROOT).source) == (here, "git")
    assert provenance(tmp_path).commit is None and "unknown" in provenance(tmp_path).source
    monkeypatch.setenv(COMMIT_ENV, "5b7ce8c0")
    monkeypatch.setenv(CLEAN_ENV, "1")
    assert provenance(ROOT) == Provenance("5b7ce8c0", True, f"${COMMIT_ENV}, ${CLEAN_ENV}")
