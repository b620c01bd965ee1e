"""``syncbn-harness gpu-suite``: everything CUDA, on this machine's GPU, packed into a few files."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from harness.commands import cli


@cli.command("gpu-suite")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="gpu-suite", show_default=True,
              help="Where the packed results go (at most eight files; see docs/gpu-suite.md).")
@click.option("--budget", type=click.IntRange(min=60), default=None, metavar="SECONDS",
              help="The whole suite's time limit (default 450); each step has its own limit within it.")
@click.option("--work", "work_dir", type=click.Path(file_okay=False), default=None,
              help="Keep the unpacked work folder here (default: a temporary folder, removed once packed).")
@click.option("--apex-src", type=click.Path(file_okay=False), default=None, metavar="CHECKOUT",
              help="An apex checkout from before NVIDIA/apex PR #1896: its syncbn extension is built and apex runs "
                   "the layer and training-system cases too. Missing or unusable: apex's steps are not run, with "
                   "the reason, and the rest runs.")
@click.option("--emulated", type=click.Path(file_okay=False), default=None, metavar="STORE",
              help="A store of cpu-emulation records of the same cases made with the same torch build. Default "
                   "(and when STORE is missing): the suite makes them on this machine's CPUs while the GPU works.")
@click.option("--repro", "repros", multiple=True, type=click.Path(exists=True), metavar="FILE|DIR",
              help="A standalone repro file to run on the GPU, or a folder whose *.py files all run (repeatable); "
                   "each is judged by the verdict line it prints.")
@click.option("--plan", "show_plan", is_flag=True, help="Print the steps for this machine and run nothing.")
@click.option("--prepare-emulated", type=click.Path(file_okay=False), default=None, metavar="STORE",
              help="On a CPU machine, instead of the suite: run the suite's layer and training-system cases for "
                   "torch (cpu-emulation) and the reference into STORE, to carry to the GPU machine for --emulated.")
def gpu_suite(out_dir, budget, work_dir, apex_src, emulated, repros, show_plan, prepare_emulated):
    """Build the CUDA kernels, test them, benchmark and profile them, run the layer, training-system and compile
    cases on CUDA (torch, reference, apex), run standalone repros, probe NCCL, set cpu-emulation against CUDA,
    write the report: all under one time budget.

    Runs in the Python that holds a CUDA torch and installs nothing. Exit 0 when every step that can run here
    passed, 1 when one failed or was not reached, 3 when the suite cannot run here (no GPU, a CPU-only torch, no
    nvcc). Steps that cannot run on this machine (no apex checkout, no ncu, one GPU for nccl) say why.
    """
    from harness.gpu_suite import SuiteOptions, inputs, run_suite
    from harness.gpu_suite.steps import DEFAULT_BUDGET_S, plan

    opts = SuiteOptions(out=Path(out_dir), budget_s=float(budget or DEFAULT_BUDGET_S),
                        work=Path(work_dir) if work_dir else None, apex_src=Path(apex_src) if apex_src else None,
                        emulated=Path(emulated) if emulated else None, repros=tuple(Path(r) for r in repros))
    if prepare_emulated:
        import subprocess

        from harness.gpu_suite.steps import layer_selection, system_selection

        argv = [sys.executable, "-m", "harness", "run", "--device", "cpu", "--backend", "gloo", "--impl", "torch",
                "--impl", "reference", "--no-diagnose", "--store", prepare_emulated]
        codes = [subprocess.call(argv + list(flags)) for flags in (layer_selection(), system_selection())]
        sys.exit(max(codes))
    if show_plan:
        from harness.gpu_suite.machine import describe

        for step in plan(inputs(opts, Path(work_dir or "<work>"), describe())):
            when = ("early, " if step.early else f"with {step.starts_with}, " if step.starts_with else
                    "beside the step before, " if step.with_previous else "")
            if step.skip:
                click.echo(f"{step.name} (not run: {step.skip})")
            else:
                click.echo(f"{step.name} ({when}at most {step.limit_s}s): {' '.join(step.argv)}")
        return
    sys.exit(run_suite(opts))
