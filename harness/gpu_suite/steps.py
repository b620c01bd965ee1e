"""The GPU suite's steps: what runs, in which order, under which limits (pure: nothing runs here).

Steps come in order of value, so that a suite stopped by its budget has done
the most useful part: the reference kernels built for the GPU present (a
required step: nothing after it can work without them), the CUDA kernel tests,
the CUDA kernel benchmark, the layer cases on CUDA for torch (native kernels)
and the reference, apex's optimized SyncBatchNorm (built from the user's
checkout, its build started with the first step since it needs no GPU), the
training-system cases (DDP, training loops, conversion) on CUDA, the
standalone repros, the fidelity table and the report. nccl and the CUDA-graph
family need a GPU per rank, so they are planned only with two or more GPUs.

Each step runs under its own limit and within what is left of the budget, less
a reserve kept for the report (:func:`step_limit`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

REPORT_RESERVE_S = 30  # kept back from every other step, so that the report is always written
KILL_AFTER_S = 10  # SIGKILL this long after SIGTERM (harness commands reap their ranks on SIGTERM)
DEFAULT_BUDGET_S = 420
CASE_TIMEOUT_S = 30  # per case on the GPU: a hang costs this, once (no diagnosis re-run)
SLOW_ON_GPU = ("compile",)  # inductor's CUDA compiles take minutes per case: outside the suite's budget


def system_selection() -> tuple[str, ...]:
    """The selection flags for the default selection's training-system cases (DDP, training loops, conversion,
    checkpoints), less the families too slow for the budget."""
    from harness import catalog

    cases = [c for c in catalog.select() if c.scenario != "layer" and c.family not in SLOW_ON_GPU]
    scenarios = sorted({c.scenario for c in cases})
    families = sorted({c.family for c in cases})
    return (*(arg for sc in scenarios for arg in ("--scenario", sc)),
            *(arg for f in families for arg in ("--case", f"{f}/*")))


def layer_selection() -> tuple[str, ...]:
    """The selection flags for the default selection's layer cases, less the families too slow for the budget."""
    from harness import catalog

    families = sorted({c.family for c in catalog.select(scenarios=["layer"])} - set(SLOW_ON_GPU))
    return ("--scenario", "layer", *(arg for f in families for arg in ("--case", f"{f}/*")))


@dataclass(frozen=True)
class Step:
    """One command of the suite. Its stdout and stderr go to ``logs/<log>`` (stdout to ``stdout`` if given)."""

    name: str
    argv: tuple[str, ...]
    log: str
    limit_s: int  # stopped (SIGTERM, then SIGKILL) past this, or past what is left of the budget
    required: bool = False  # the suite stops when a required step fails
    closing: bool = False  # runs with the reserve even when the budget is spent (the report)
    early: bool = False  # started with the first step (needs no GPU and nothing before it), joined at its turn
    stdout: Optional[str] = None  # a file under the work folder for stdout alone (a step's JSON output)
    env: dict = field(default_factory=dict)  # set for this step only
    ok_exits: tuple[int, ...] = (0,)  # exit statuses that count as passed (a repro's 1 is its verdict)


@dataclass(frozen=True)
class Inputs:
    """What the plan depends on."""

    work: Path  # the work folder: results/, report/, logs/
    arch: str  # e.g. "9.0" (";"-joined for several kinds of GPU)
    gpus: int
    python: str  # the interpreter that holds the CUDA torch (the one running the suite)
    tests: Optional[Path] = None  # the checkout's tests/ folder, None for an installed copy
    apex_src: Optional[Path] = None
    apex_pythonpath: Optional[str] = None  # where apex and its built syncbn are, for the apex run
    emulated: Optional[Path] = None  # a store of torch's cpu-emulation records of the same cases
    repros: tuple[Path, ...] = ()


def step_limit(step: Step, remaining_s: float) -> int:
    """Seconds ``step`` may run with ``remaining_s`` of the budget left; 0: do not start it."""
    if step.closing:
        return max(REPORT_RESERVE_S, min(step.limit_s, int(remaining_s)))
    return max(0, min(step.limit_s, int(remaining_s - REPORT_RESERVE_S - KILL_AFTER_S)))


def plan(i: Inputs) -> list[Step]:
    """The steps, in the order they run (``early`` ones start with the first)."""
    harness = (i.python, "-m", "harness")
    results, report = str(i.work / "results"), str(i.work / "report")
    layers = layer_selection()
    run = (*harness, "run", "--device", "cuda", "--store", results, "--timeout", str(CASE_TIMEOUT_S),
           "--no-diagnose")
    steps = [Step("build-kernels", (*harness, "build-kernels", "--cuda", "--cuda-arch", i.arch), "build-kernels.txt",
                  240, required=True)]
    if i.apex_src:
        steps.append(Step("build-apex", (*harness, "build-apex", "--src", str(i.apex_src), "--cuda-arch", i.arch),
                          "build-apex.txt", 240, early=True))
    if i.tests:
        steps.append(Step("pytest -m cuda", (i.python, "-m", "pytest", str(i.tests), "-m", "cuda", "-p",
                                             "no:cacheprovider", "-q", "-rfEs", "-n", "4",
                                             "--junitxml=" + str(i.work / "pytest-cuda.xml")),
                          "pytest-cuda.txt", 150))
    steps.append(Step("bench kernels", (*harness, "bench", "kernels", "--device", "cuda", "--format", "json"),
                      "bench-kernels.txt", 90, stdout="bench.json"))
    steps.append(Step("layer cases, gloo", (*run, "--backend", "gloo", "--impl", "torch", "--impl", "reference",
                                            *layers), "run-gloo.txt", 200))
    if i.apex_src:
        steps.append(Step("layer cases, gloo, apex", (*run, "--backend", "gloo", "--impl", "apex", *layers),
                          "run-apex.txt", 120, env={"PYTHONPATH": i.apex_pythonpath or ""}))
    steps.append(Step("training systems, gloo", (*run, "--backend", "gloo", "--impl", "torch", "--impl",
                                                 "reference", *system_selection()), "run-systems.txt", 150))
    for repro in i.repros:
        steps.append(Step(f"repro {repro.name}", (i.python, str(repro)), f"repro-{repro.stem}.txt", 60,
                          ok_exits=(0, 1)))
    if i.gpus >= 2:
        steps.append(Step("layer cases, nccl", (*run, "--backend", "nccl", "--impl", "torch", "--impl", "reference",
                                                *layers), "run-nccl.txt", 180))
        steps.append(Step("cuda-graph family, nccl", (*run, "--backend", "nccl", "--exhaustive", "--case",
                                                      "cuda-graph/*"), "run-cuda-graph.txt", 120))
    if i.emulated:
        steps.append(Step("fidelity", (*harness, "fidelity", "--emulated", str(i.emulated), "--native", results,
                                       "--impl", "torch", "--impl", "reference", "--out",
                                       str(i.work / "fidelity.md")), "fidelity.txt", 60))
    steps.append(Step("report", (*harness, "report", "--store", results, "--out", report), "report.txt", 90,
                      closing=True))
    return steps
