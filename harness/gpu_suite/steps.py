"""The GPU suite's steps: what runs, in which order and alongside what, under which limits (pure: nothing runs here).

Steps come in order of value, so that a suite stopped by its budget has done
the most useful part first:

1. the reference kernels built for the GPU present (required: nothing after
   it can work without them); apex's ``syncbn`` extension builds beside it;
2. the CUDA kernel tests, then the kernel benchmark alone on the GPU (it times
   things); the cpu-emulation of the same cases starts with the tests, on this
   machine's CPUs (the same torch build, so that the fidelity table compares
   like with like);
3. two waves of cases on CUDA, the steps of each side by side (16 CPUs, one
   GPU): the layer cases for torch's native kernels and the reference (the
   ``nccl-contract`` cases among them run torch's non-gloo path on CUDA
   tensors), apex's layer cases, every standalone repro and the probe of NCCL
   with two ranks on one GPU; then the training systems (DDP, training loops,
   conversion) for the three and a few compile cases;
4. the ``ncu`` profile, alone on the GPU; nccl's own families where the
   machine allows them; the fidelity table; the report.

A step that cannot run here is planned anyway, as ``not run`` with the reason
(no apex checkout, no ``ncu``, one GPU and an NCCL that refuses two ranks on
it): the summary lists what did not run and why, and the rest runs.

Each step runs under its own limit and within what is left of the budget, less
a reserve kept for the report (:func:`step_limit`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

REPORT_RESERVE_S = 30  # kept back from every other step, so that the report is always written
KILL_AFTER_S = 10  # SIGKILL this long after SIGTERM (harness commands reap their ranks on SIGTERM)
DEFAULT_BUDGET_S = 450
CASE_TIMEOUT_S = 30  # per case on the GPU: a hang costs this, once (no diagnosis re-run)
BENCH_REPEAT = 10  # CUDA-graph replays per figure: 69 shapes in about half a minute on an H200
COMPILE_TIMEOUT_S = 150  # inductor's first CUDA compile in a rank takes a minute or more
SLOW_ON_GPU = ("compile",)  # inductor's CUDA compiles take minutes per case: only COMPILE_CASES run
# One per backend family: dynamo alone, AOT autograd, and inductor's generated CUDA code.
COMPILE_CASES = ("compile/layer/eager/breaks-allowed/auto-dynamic/ws2",
                 "compile/layer/aot_eager/fullgraph/dynamic/ws2",
                 "compile/layer/inductor/breaks-allowed/auto-dynamic/ws2")
NCCL_MULTI_RANK = (2, 30)  # the first NCCL release that can put two ranks on one GPU (NCCL_MULTI_RANK_GPU_ENABLE=1)


def system_selection() -> tuple[str, ...]:
    """The selection flags for the default selection's cases of every scenario but ``layer`` (DDP, training loops,
    conversion, checkpoints; and torch's private ops, the ``private-ops`` family: CUDA's real kernels op by op),
    less the families too slow for the budget."""
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


def compile_selection() -> tuple[str, ...]:
    """The selection flags for :data:`COMPILE_CASES`."""
    return tuple(arg for case in COMPILE_CASES for arg in ("--case", case))


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
    starts_with: Optional[str] = None  # started when that step starts, joined at its own turn
    with_previous: bool = False  # runs side by side with the step before it (one wave)
    exclusive: bool = False  # times something: every step started early is waited for first
    needs: tuple[str, ...] = ()  # steps that must have passed, else this one is not run
    skip: Optional[str] = None  # why this step cannot run on this machine: planned as not run
    stdout: Optional[str] = None  # a file under the work folder for stdout alone (a step's JSON output)
    env: dict = field(default_factory=dict)  # set for this step only
    ok_exits: tuple[int, ...] = (0,)  # exit statuses that count as passed


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
    apex_missing: Optional[str] = None  # why there is no apex checkout to build (said in the not-run steps)
    emulated: Optional[Path] = None  # a store of cpu-emulation records brought along; None: made here
    repros: tuple[Path, ...] = ()
    ncu: Optional[str] = None  # Nsight Compute's command line tool, where this machine has it
    nccl: Optional[tuple[int, ...]] = None  # the NCCL version torch carries, e.g. (2, 28, 9)


def step_limit(step: Step, remaining_s: float) -> int:
    """Seconds ``step`` may run with ``remaining_s`` of the budget left; 0: do not start it."""
    if step.closing:
        return max(REPORT_RESERVE_S, min(step.limit_s, int(remaining_s)))
    return max(0, min(step.limit_s, int(remaining_s - REPORT_RESERVE_S - KILL_AFTER_S)))


def nccl_text(version: Optional[tuple[int, ...]]) -> str:
    return ".".join(map(str, version)) if version else "unknown"


def _nccl_skip(i: Inputs) -> Optional[str]:
    """Why nccl's own families cannot run here, or None."""
    if i.gpus >= 2:
        return None
    if i.nccl is None:
        return "torch carries no NCCL here"
    if tuple(i.nccl[:2]) < NCCL_MULTI_RANK:
        return (f"one GPU, and NCCL {nccl_text(i.nccl)} (torch's) refuses two ranks on one GPU; NCCL 2.30 and "
                "newer allow it (NCCL_MULTI_RANK_GPU_ENABLE=1), and a machine with a GPU per rank needs nothing")
    return ("one GPU: the engine gives each nccl rank a GPU of its own; two ranks on one GPU under NCCL "
            f"{nccl_text(i.nccl)} is shown by the probe only")


def plan(i: Inputs) -> list[Step]:
    """The steps, in the order they are recorded (see the module docstring for how they overlap)."""
    harness = (i.python, "-m", "harness")
    results, report = str(i.work / "results"), str(i.work / "report")
    layers = layer_selection()
    run = (*harness, "run", "--device", "cuda", "--store", results, "--timeout", str(CASE_TIMEOUT_S),
           "--no-diagnose")
    gloo = (*run, "--backend", "gloo")
    apex_env = {"PYTHONPATH": i.apex_pythonpath or ""}
    apex_skip = None if i.apex_src else (i.apex_missing or "no apex checkout given (--apex-src)")
    apex = dict(needs=("build-apex",), env=apex_env, skip=apex_skip)

    steps = [Step("build-kernels", (*harness, "build-kernels", "--cuda", "--cuda-arch", i.arch), "build-kernels.txt",
                  240, required=True),
             Step("build-apex", (*harness, "build-apex", "--src", str(i.apex_src), "--cuda-arch", i.arch),
                  "build-apex.txt", 240, early=True, skip=apex_skip)]
    steps.append(Step("pytest -m cuda", (i.python, "-m", "pytest", str(i.tests), "-m", "cuda", "-p",
                                         "no:cacheprovider", "-q", "-rfEs", "-n", "8",
                                         "--junitxml=" + str(i.work / "pytest-cuda.xml")),
                      "pytest-cuda.txt", 150,
                      skip=None if i.tests else "an installed copy of the harness: no tests/ folder beside it"))
    steps.append(Step("bench kernels", (*harness, "bench", "kernels", "--device", "cuda", "--format", "json",
                                        "--repeat", str(BENCH_REPEAT)),
                      "bench-kernels.txt", 120, stdout="bench.json", exclusive=True))
    # The layer wave.
    steps.append(Step("layer cases, gloo", (*gloo, "--impl", "torch", "--impl", "reference", *layers),
                      "run-gloo.txt", 200))
    steps.append(Step("layer cases, gloo, apex", (*gloo, "--impl", "apex", *layers), "run-apex.txt", 150,
                      with_previous=True, **apex))
    if i.repros:
        steps.append(Step("repros", (i.python, "-m", "harness.gpu_suite.repros", "--out",
                                     str(i.work / "repros.json"), "--logs", str(i.work / "logs" / "repros"),
                                     *(("--apex-path", i.apex_pythonpath) if i.apex_src and i.apex_pythonpath
                                       else ()), *map(str, i.repros)),
                          "repros.txt", 180, with_previous=True))
    steps.append(Step("nccl two ranks on one GPU", (i.python, "-m", "harness.gpu_suite.nccl_probe", "--out",
                                                     str(i.work / "nccl-probe.json")),
                      "nccl-probe.txt", 60, with_previous=True, ok_exits=(0, 1),
                      skip=None if i.gpus >= 1 and i.nccl else "torch carries no NCCL here"))
    systems = system_selection()
    # A second wave: seven harness runs at once on 16 CPUs stretched large cases past their limit (2026-11-28:
    # a ResNet-50 layer case "hung" for torch and apex alike, and every run stopped at its limit).
    steps.append(Step("training systems, gloo", (*gloo, "--impl", "torch", "--impl", "reference", *systems),
                      "run-systems.txt", 200))
    steps.append(Step("training systems, gloo, apex", (*gloo, "--impl", "apex", *systems), "run-systems-apex.txt",
                      200, with_previous=True, **apex))
    steps.append(Step("compile cases, gloo", (*harness, "run", "--device", "cuda", "--store", results, "--timeout",
                                              str(COMPILE_TIMEOUT_S), "--no-diagnose", "--backend", "gloo",
                                              "--impl", "torch", "--impl", "reference", *compile_selection()),
                      "run-compile.txt", 200, with_previous=True))
    steps.append(Step("ncu profile", (i.python, "-m", "harness.gpu_suite.profile", "--ncu", str(i.ncu),
                                      "--out", str(i.work)), "ncu.txt", 60, exclusive=True,
                      skip=None if i.ncu else "no Nsight Compute (ncu) on this machine"))
    nccl_skip = _nccl_skip(i)
    steps.append(Step("layer cases, nccl", (*run, "--backend", "nccl", "--impl", "torch", "--impl", "reference",
                                            *layers), "run-nccl.txt", 180, skip=nccl_skip))
    steps.append(Step("cuda-graph family, nccl", (*run, "--backend", "nccl", "--exhaustive", "--case",
                                                  "cuda-graph/*"), "run-cuda-graph.txt", 120, with_previous=True,
                      skip=nccl_skip))
    emulated = i.emulated or i.work / "emulated"
    if i.emulated is None:
        steps.append(Step("cpu-emulation", (*harness, "gpu-suite", "--prepare-emulated", str(emulated)),
                          "cpu-emulation.txt", 300, starts_with="pytest -m cuda"))
    steps.append(Step("fidelity", (*harness, "fidelity", "--emulated", str(emulated), "--native", results,
                                   "--impl", "torch", "--impl", "reference", "--out", str(i.work / "fidelity.md")),
                      "fidelity.txt", 60, needs=() if i.emulated else ("cpu-emulation",)))
    steps.append(Step("report", (*harness, "report", "--store", results, "--out", report), "report.txt", 90,
                      closing=True))
    return steps
