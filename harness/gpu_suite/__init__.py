"""The GPU suite: everything CUDA the harness can check, on the GPU of this machine, in one bounded command.

``syncbn-harness gpu-suite`` (and ``nox -s gpu``, which calls it) runs in
whatever Python holds a CUDA build of torch and installs or downloads
nothing: a lent GPU machine reaches no package index. It describes the
machine (:mod:`~harness.gpu_suite.machine`), plans its steps
(:mod:`~harness.gpu_suite.steps`), runs each under its limit within one
budget (:mod:`~harness.gpu_suite.runner`) and packs what they left into at
most six files (:mod:`~harness.gpu_suite.pack`), whatever happened: a
failed or stopped step, Ctrl-C, or no GPU at all. A machine where the suite
cannot run (no GPU, a CPU-only torch, no CUDA toolkit) is a failure (exit 3)
with the reason, never a skip.

Exit status: 0 every step passed; 1 a step failed, timed out or was not run
for want of budget (``summary.md`` says which, and the records say why);
3 the suite cannot run here.
"""

from __future__ import annotations

import datetime
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from harness.gpu_suite import machine as machine_mod
from harness.gpu_suite.pack import clear, pack
from harness.gpu_suite.runner import run_steps
from harness.gpu_suite.steps import Inputs, plan

EXIT_CANNOT_RUN = 3


@dataclass(frozen=True)
class SuiteOptions:
    """What the command line asks of the suite."""

    out: Path
    budget_s: float
    work: Optional[Path] = None  # kept when given; else a temporary folder, removed once packed
    apex_src: Optional[Path] = None
    emulated: Optional[Path] = None
    repros: tuple[Path, ...] = ()


def tests_folder() -> Optional[Path]:
    """The checkout's ``tests/`` beside the package (an editable install), or None for an installed copy."""
    here = Path(__file__).resolve().parents[2] / "tests"
    return here if (here / "kernels" / "test_cuda_kernels.py").is_file() else None


def inputs(opts: SuiteOptions, work: Path, machine: dict) -> Inputs:
    """The plan's inputs on this machine (apex's built-extension path is known before it is built)."""
    apex_path = None
    if opts.apex_src:
        from harness.impls.apex_build import build_dir, pythonpath

        apex_path = pythonpath(opts.apex_src, build_dir(opts.apex_src.resolve(), machine_mod.archs(machine)))
    return Inputs(work=work, arch=machine_mod.archs(machine) or "<arch of this GPU>", gpus=len(machine["gpus"]),
                  python=sys.executable, tests=tests_folder(), apex_src=opts.apex_src, apex_pythonpath=apex_path,
                  emulated=opts.emulated, repros=opts.repros)


class _Console:
    """Lines to stdout and appended to ``console.txt`` in the output folder."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(path, "a", encoding="utf-8")

    def __call__(self, line: str) -> None:
        print(line, flush=True)
        self.file.write(line + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def run_suite(opts: SuiteOptions) -> int:
    """Run the suite into ``opts.out`` (see the module docstring); its exit status."""
    if opts.apex_src:
        from harness.impls.apex_build import check_checkout

        check_checkout(opts.apex_src)
    opts.out.mkdir(parents=True, exist_ok=True)
    clear(opts.out)
    echo = _Console(opts.out / "console.txt")
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    work = opts.work or Path(tempfile.mkdtemp(prefix="syncbn-gpu-suite-"))
    work.mkdir(parents=True, exist_ok=True)
    machine = None
    try:
        machine = machine_mod.describe()
        gpus = ", ".join(g["name"] for g in machine["gpus"]) or "no GPU"
        echo(f"[gpu-suite] {date}: {gpus}; torch {machine['torch']} (CUDA {machine['torch_cuda']}); "
             f"budget {opts.budget_s:.0f}s; each step's command and log: steps.json, suite.tar.gz")
        reason = machine_mod.cannot_run(machine)
        if reason:
            echo(f"[gpu-suite] cannot run here: {reason}")
            return EXIT_CANNOT_RUN
        env = {**os.environ, "TORCH_CUDA_ARCH_LIST": machine_mod.archs(machine), "PYTHONUNBUFFERED": "1"}
        env.setdefault("CUDA_HOME", machine["cuda_home"])
        header = {"date": date, "gpus": machine["gpus"], "torch": machine["torch"]}
        outcomes = run_steps(plan(inputs(opts, work, machine)), work, env, opts.budget_s, header=header, echo=echo)
        bad = [o for o in outcomes if not o.ok]
        echo("[gpu-suite] " + ("every step passed" if not bad else
                               "not passed: " + "; ".join(f"{o.step} ({o.outcome})" for o in bad)))
        return 1 if bad else 0
    finally:
        written = pack(work, opts.out, machine, date)
        echo(f"[gpu-suite] packed {len(written)} files into {opts.out}: {', '.join(p.name for p in written)}")
        echo.close()
        if opts.work is None:
            shutil.rmtree(work, ignore_errors=True)
