"""The GPU suite: everything CUDA the harness can check, on the GPU of this machine, in one bounded command.

``syncbn-harness gpu-suite`` (and ``nox -s gpu``, which calls it) runs in
whatever Python holds a CUDA build of torch and installs or downloads
nothing: a lent GPU machine reaches no package index. It describes the
machine (:mod:`~harness.gpu_suite.machine`), plans its steps
(:mod:`~harness.gpu_suite.steps`), runs them in waves under their limits
within one budget (:mod:`~harness.gpu_suite.runner`) and packs what they left
into at most eight files (:mod:`~harness.gpu_suite.pack`), whatever
happened: a failed or stopped step, Ctrl-C, or no GPU at all. Three steps
are modules of their own, run as ``python -m``: the standalone repros judged
by the line they print (:mod:`~harness.gpu_suite.repros`), the Nsight
Compute profile (:mod:`~harness.gpu_suite.profile`) and the probe of NCCL
with two ranks on one GPU (:mod:`~harness.gpu_suite.nccl_probe`). Every
table of a run is made from its raw files (:mod:`~harness.gpu_suite.tables`),
and a run's raw files are filed in the repository, where the pages that
cite them are checked against them (:mod:`~harness.gpu_suite.evidence`). A machine where the suite
cannot run (no GPU, a CPU-only torch, no CUDA toolkit) is a failure of the
harness (exit 3, :data:`~harness.errors.EXIT_HARNESS`) with the reason, never a skip.

A missing optional input (no apex checkout, no ``ncu``, one GPU where nccl
needs two) leaves its steps ``not run`` with the reason; the rest runs.

Exit status: 0 every step that could run here passed; 1 a step failed, timed
out or was not run for want of budget (``summary.md`` says which, and the
records say why); 3 the suite cannot run here.
"""

from __future__ import annotations

import datetime
import os
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from harness.errors import EXIT_HARNESS
from harness.gpu_suite.machine import Machine, describe
from harness.gpu_suite.pack import clear, pack
from harness.gpu_suite.runner import Outcome, run_steps
from harness.gpu_suite.steps import Inputs, plan


@dataclass(frozen=True)
class SuiteOptions:
    """What the command line asks of the suite."""

    out: Path
    budget_s: float
    work: Optional[Path] = None  # kept when given; else a temporary folder, removed once packed
    apex_src: Optional[Path] = None
    emulated: Optional[Path] = None  # None: the suite makes its own on this machine's CPUs
    repros: tuple[Path, ...] = ()  # files, or folders whose *.py files are all run


def repro_files(paths: tuple[Path, ...]) -> tuple[Path, ...]:
    """The repro files of ``paths``: a file as it is, a folder's ``*.py`` in name order."""
    out: list[Path] = []
    for p in paths:
        out += sorted(p.resolve().glob("*.py")) if p.is_dir() else [p.resolve()]
    return tuple(out)


def apex_problem(src: Optional[Path]) -> Optional[str]:
    """Why ``src`` cannot give apex here (not given, not a checkout of a usable commit), or None."""
    if src is None:
        return "no apex checkout given (--apex-src)"
    from harness.errors import UsageError
    from harness.impls.apex_build import check_checkout

    try:
        check_checkout(src)
    except UsageError as exc:
        return str(exc)
    return None


def tests_folder() -> Optional[Path]:
    """The checkout's ``tests/`` beside the package (an editable install), or None for an installed copy."""
    here = Path(__file__).resolve().parents[2] / "tests"
    return here if (here / "kernels" / "test_cuda_kernels.py").is_file() else None


def inputs(opts: SuiteOptions, work: Path, machine: Machine) -> Inputs:
    """The plan's inputs on this machine (apex's built-extension path is known before it is built)."""
    apex_path, apex_missing = None, apex_problem(opts.apex_src)
    apex_src = opts.apex_src if apex_missing is None else None
    if apex_src:
        from harness.impls.apex_build import build_dir, pythonpath

        apex_path = pythonpath(apex_src, build_dir(apex_src.resolve(), machine.archs))
    emulated = opts.emulated if opts.emulated and opts.emulated.is_dir() else None
    return Inputs(work=work, arch=machine.archs or "<arch of this GPU>", gpus=len(machine.gpus),
                  python=sys.executable, tests=tests_folder(), apex_src=apex_src, apex_pythonpath=apex_path,
                  apex_missing=apex_missing, emulated=emulated, repros=repro_files(opts.repros),
                  ncu=machine.ncu, nccl=machine.nccl or None)


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
    opts.out.mkdir(parents=True, exist_ok=True)
    clear(opts.out)
    echo = _Console(opts.out / "console.txt")
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    work = opts.work or Path(tempfile.mkdtemp(prefix="syncbn-gpu-suite-"))
    work.mkdir(parents=True, exist_ok=True)
    machine: Optional[Machine] = None
    try:
        machine = describe()
        gpus = ", ".join(g.name for g in machine.gpus) or "no GPU"
        echo(f"[gpu-suite] {date}: {gpus}; torch {machine.torch} (CUDA {machine.torch_cuda}); "
             f"budget {opts.budget_s:.0f}s; each step's command and log: steps.json, suite.tar.gz")
        reason = machine.cannot_run()
        if reason:
            echo(f"[gpu-suite] cannot run here: {reason}")
            return EXIT_HARNESS
        if opts.emulated and not opts.emulated.is_dir():
            echo(f"[gpu-suite] --emulated {opts.emulated}: no such store; the cpu-emulation records are made here")
        env = {**os.environ, "TORCH_CUDA_ARCH_LIST": machine.archs, "PYTHONUNBUFFERED": "1"}
        env.setdefault("CUDA_HOME", machine.cuda_home)
        header = {"date": date, "gpus": [asdict(g) for g in machine.gpus], "torch": machine.torch,
                  "harness_commit": machine.harness.commit, "harness_tree_clean": machine.harness.clean}
        steps = plan(inputs(opts, work, machine))
        planned_out = {s.skip for s in steps if s.skip}  # cannot run on this machine: said, not failed
        outcomes = run_steps(steps, work, env, opts.budget_s, header=header, echo=echo)
        bad = [o for o in outcomes if not o.ok and not (o.outcome is Outcome.NOT_RUN and o.reason in planned_out)]
        echo("[gpu-suite] " + ("every step passed" if not bad else
                               "not passed: " + "; ".join(f"{o.step} ({o.outcome})" for o in bad)))
        return 1 if bad else 0
    finally:
        written = pack(work, opts.out, machine, date)
        echo(f"[gpu-suite] packed {len(written)} files into {opts.out}: {', '.join(p.name for p in written)}")
        echo.close()
        if opts.work is None:
            shutil.rmtree(work, ignore_errors=True)
