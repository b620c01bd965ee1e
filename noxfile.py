"""nox sessions: the tests, lint, the CUDA compile check, runs against several PyTorch builds, the GPU suite.

Every session installs its own torch build explicitly: `torch==2.13.0` is the
CPU wheel on these machines' local disk, `torch==2.14.1` the CUDA 13 build.
"""

from __future__ import annotations

import json
import os
import time
from typing import NamedTuple

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

CPU_TORCH = "torch==2.13.0"
CUDA_TORCH = "torch==2.14.1"


@nox.session(python="3.11")
def tests(session: nox.Session) -> None:
    """The harness's own tests (CPU, gloo), two xdist workers."""
    session.install(CPU_TORCH, "-e", ".[test]")
    session.run("python", "-m", "pytest", "-n", "2", *session.posargs)


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    """ruff over the package, cases and tests."""
    session.install("ruff")
    session.run("ruff", "check", "--select", "E,F,W,B", "--line-length", "120", "harness", "cases", "kernels",
                "tests", "noxfile.py", "setup.py")


@nox.session(name="cuda_compile", python="3.11")
def cuda_compile(session: nox.Session) -> None:
    """Compile the CUDA kernels for sm_80 and sm_90 against the CUDA 13 build of torch (no GPU needed)."""
    session.install(CUDA_TORCH, "-e", ".")
    cache = os.path.join(session.virtualenv.location, "syncbn-cache")
    session.run("syncbn-harness", "build-kernels", "--cuda", "--cuda-arch", "8.0;9.0",
                env={"SYNCBN_HARNESS_CACHE": cache, "MAX_JOBS": "2"})
    # The library that was built must load in a CUDA build of torch and expose CUDA kernels for every op.
    session.run("python", "-c", (
        "import torch; from harness.kernels import extension; "
        "spec = extension.default_spec(cuda=True, cuda_archs='8.0;9.0'); extension.build(spec); "
        "ops = ['batch_norm_stats', 'batch_norm_gather_stats_with_counts', 'batch_norm_elemt', "
        "'batch_norm_backward_reduce', 'batch_norm_backward_elemt', 'welford_stats', 'welford_merge']; "
        "missing = [o for o in ops if not torch._C._dispatch_has_kernel_for_dispatch_key("
        "'syncbn_ref::' + o, 'CUDA')]; "
        "assert not missing, missing; print('CUDA kernels registered for', len(ops), 'ops')"),
        env={"SYNCBN_HARNESS_CACHE": cache})


@nox.session(python="3.11")
@nox.parametrize("torch_build", [CPU_TORCH, CUDA_TORCH], ids=["torch-2.13.0", "torch-2.14.1"])
def builds(session: nox.Session, torch_build: str) -> None:
    """The default selection against torch 2.13.0 and 2.14.1 (each in its own venv) into one store, then the report.

    `nox -s builds` runs both builds in turn; each writes the cross-build report over the whole store
    afterwards, so the last one covers both. Extra arguments go to `run` (e.g. `-- --resume`).
    """
    session.install(torch_build, "-e", ".")
    store = os.environ.get("SYNCBN_HARNESS_STORE") or os.path.join("results", "builds")
    out = os.environ.get("SYNCBN_HARNESS_REPORTS") or os.path.join("reports", "builds")
    cache = os.path.join(session.virtualenv.location, "syncbn-cache")
    env = {"SYNCBN_HARNESS_CACHE": cache, "MAX_JOBS": "2"}
    session.run("syncbn-harness", "env", env=env)
    # Known issues do not fail a run; anything else that fails (exit 1) fails the session, after the report is
    # written so that the failure can be read there.
    try:
        session.run("syncbn-harness", "run", "--device", "cpu", "--store", store, *session.posargs, env=env)
    finally:
        session.run("syncbn-harness", "report", "--store", store, "--out", out, env=env)


# ---------------------------------------------------------------------- the GPU suite

GPU_OUT_ENV = "SYNCBN_HARNESS_GPU_OUT"
DEFAULT_GPU_OUT = "gpu-suite"
GPU_BUDGET_ENV = "SYNCBN_HARNESS_GPU_BUDGET_S"
# The whole session, the torch install included, inside the 10 minutes one command gets on a lent GPU.
DEFAULT_GPU_BUDGET_S = 570
REPORT_RESERVE_S = 45  # kept back from every other step, so the report is always written
KILL_AFTER_S = 15  # SIGKILL this long after SIGTERM (the harness reaps its ranks on SIGTERM)


class GpuStep(NamedTuple):
    """One command of the GPU suite: its output goes to ``log`` under the output folder."""

    name: str
    argv: list
    log: str
    limit_s: int  # stopped (SIGTERM, then SIGKILL) past this, or past what is left of the budget
    required: bool = False  # the suite stops when a required step fails (nothing after it could work)
    closing: bool = False  # runs with the reserve even when the budget is spent (the report)


def step_limit(step: GpuStep, remaining_s: float) -> int:
    """Seconds ``step`` may run with ``remaining_s`` of the budget left; 0: do not start it (pure)."""
    if step.closing:
        return max(REPORT_RESERVE_S, min(step.limit_s, int(remaining_s)))
    return max(0, min(step.limit_s, int(remaining_s - REPORT_RESERVE_S - KILL_AFTER_S)))


def gpu_steps(out: str, cuda_arch: str) -> list:
    """What ``nox -s gpu`` runs, in order, into the folder ``out`` (kernels built for ``cuda_arch``)."""
    results, report = os.path.join(out, "results"), os.path.join(out, "report")
    run = ["syncbn-harness", "run", "--device", "cuda", "--store", results]
    return [
        GpuStep("env", ["syncbn-harness", "env"], "env.txt", 120, required=True),
        GpuStep("build-kernels", ["syncbn-harness", "build-kernels", "--cuda", "--cuda-arch", cuda_arch],
                "build-kernels.txt", 480, required=True),
        GpuStep("pytest -m cuda", ["python", "-m", "pytest", "-m", "cuda", "-p", "no:cacheprovider", "-rs",
                                   "--continue-on-collection-errors",
                                   "--junitxml=" + os.path.join(out, "pytest-cuda.xml")], "pytest-cuda.txt", 420),
        GpuStep("default selection, gloo", run + ["--backend", "gloo"], "run-gloo.txt", 420),
        GpuStep("default selection, nccl", run + ["--backend", "nccl"], "run-nccl.txt", 420),
        GpuStep("cuda-graph family, nccl", run + ["--backend", "nccl", "--exhaustive", "--case", "cuda-graph/*"],
                "run-cuda-graph.txt", 180),
        GpuStep("bench kernels", ["syncbn-harness", "bench", "kernels", "--device", "cuda"], "bench-kernels.txt", 240),
        GpuStep("report", ["syncbn-harness", "report", "--store", results, "--out", report], "report.txt", 120,
                closing=True),
    ]


GPU_PROBE = (
    "import json, torch; n = torch.cuda.device_count(); "
    "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, 'count': n, "
    "'names': [torch.cuda.get_device_name(i) for i in range(n)], "
    "'archs': sorted({'%d.%d' % torch.cuda.get_device_capability(i) for i in range(n)})}))"
)


@nox.session(python="3.11")
def gpu(session: nox.Session) -> None:
    """The GPU suite: everything CUDA, on the GPU of this machine, into one folder (`gpu-suite/`).

    Steps (:func:`gpu_steps`; `-- --plan` prints them and runs nothing): build the reference kernels for the
    GPUs present; `pytest -m cuda` (the CUDA kernels against the float64 truth and the CPU kernels, opcheck);
    the default selection with `--device cuda` over gloo (ranks share one GPU) and over nccl (one GPU per rank:
    cases with more ranks than GPUs are skipped, saying so); the cuda-graph family over nccl (likewise);
    `bench kernels --device cuda`; the report. Each step's output is saved in the folder
    (`$SYNCBN_HARNESS_GPU_OUT`, default `gpu-suite/`) with `steps.json` (exit status and seconds per step), the
    store in `results/` and the report in `report/`. Every step runs even after a failure (but the build), under
    its time limit and within the session's budget (`$SYNCBN_HARNESS_GPU_BUDGET_S`, default 570 s, install
    included), less a reserve that always leaves time for the report; the session fails at the end if any
    step failed or was not started for want of time.

    Time on one H100 with a cold cache, estimated (the suite has not run on a GPU yet): creating the venv with
    the CUDA torch build (5.5 GB from local disk) 1.5-2.5 min; the kernel build for one architecture 2-4 min on
    16 cores (the .cu file dominates); `pytest -m cuda` about 1 min (mostly the float64 truth and the CPU
    kernels on the CPU side); the default selection over gloo 1-2 min (about 1 min on two CPU cores); nccl and
    the cuda-graph family seconds with one GPU (all skipped), a few minutes more with several; the benchmark
    under 1 min; the report seconds. About 6-10 min with one GPU.

    Where pip cannot reach `torch==2.14.1`, install a CUDA torch and this harness (`pip install -e '.[test]'`)
    and run `nox -s gpu --no-venv --no-install` in that environment.
    """
    deadline = time.monotonic() + float(os.environ.get(GPU_BUDGET_ENV) or DEFAULT_GPU_BUDGET_S)
    out = os.path.abspath(os.environ.get(GPU_OUT_ENV) or DEFAULT_GPU_OUT)
    if "--plan" in session.posargs:
        for step in gpu_steps(out, "<arch of this GPU>"):
            session.log(f"{step.name}: {' '.join(step.argv)}  > {os.path.join(out, step.log)}")
        return
    session.install(CUDA_TORCH, "-e", ".[test]")
    probe = json.loads(session.run("python", "-c", GPU_PROBE, silent=True).strip().splitlines()[-1])
    if not probe["count"]:
        session.error(f"no GPU visible to torch {probe['torch']} (CUDA {probe['cuda']}): run `nox -s gpu` on a "
                      "machine with a GPU and its driver (and CUDA_VISIBLE_DEVICES unset or naming one)")
    arch = ";".join(probe["archs"])
    session.log(f"GPU suite on {probe['count']} x {', '.join(sorted(set(probe['names'])))} (sm {arch}) into {out}")
    os.makedirs(out, exist_ok=True)
    location = getattr(session.virtualenv, "location", None)
    env = {"TORCH_CUDA_ARCH_LIST": arch}  # every later load (ranks, pytest) finds the build made for this arch
    if not os.environ.get("SYNCBN_HARNESS_CACHE") and location:
        env["SYNCBN_HARNESS_CACHE"] = os.path.join(location, "syncbn-cache")
    ran, failed = [], []
    for step in gpu_steps(out, arch):
        limit = step_limit(step, deadline - time.monotonic())
        t0 = time.monotonic()
        code = _run_step(session, step, out, env, limit) if limit else None
        ran.append({"step": step.name, "exit": code, "seconds": round(time.monotonic() - t0, 1), "limit_s": limit,
                    "command": step.argv, "log": step.log})
        with open(os.path.join(out, "steps.json"), "w") as f:
            json.dump({"gpus": probe, "budget_s": float(os.environ.get(GPU_BUDGET_ENV) or DEFAULT_GPU_BUDGET_S),
                       "steps": ran}, f, indent=2)
        if code != 0:
            why = "not run: the time budget was spent" if code is None else f"exit {code}"
            failed.append(f"{step.name} ({why}, see {os.path.join(out, step.log)})")
            if step.required:
                break
    if failed:
        session.error("GPU suite: " + "; ".join(failed))
    session.log(f"GPU suite passed: {out}")


def _run_step(session: nox.Session, step: GpuStep, out: str, env: dict, limit_s: int) -> int:
    """Run one step under ``limit_s``, its output into its log; its exit status (124: stopped at the limit)."""
    path = os.path.join(out, step.log)
    argv = ["timeout", "--signal=TERM", f"--kill-after={KILL_AFTER_S}", str(limit_s), *step.argv]
    with open(path, "w") as log:
        try:
            session.run(*argv, env=env, stdout=log, external=True)
            code = 0
        except nox.command.CommandFailed as exc:
            code = getattr(exc, "return_code", None) or 1  # 1 also when the program could not start
    with open(path, errors="replace") as log:
        tail = log.read().splitlines()[-6:]
    session.log(f"{step.name}: exit {code} in at most {limit_s}s\n  " + "\n  ".join(tail))
    return code
