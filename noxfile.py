"""nox sessions: the tests, lint, the CUDA compile check, runs against several PyTorch builds, the GPU suite.

Every session installs its own torch build explicitly: `torch==2.13.0` is the
CPU wheel on these machines' local disk, `torch==2.14.1` the CUDA 13 build. pip
installs them without writing bytecode for every module (`--no-compile`: a
session imports a small part of torch, which Python compiles on first import),
which halves an install's time.
"""

from __future__ import annotations

import os
import sys

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

CPU_TORCH = "torch==2.13.0"
CUDA_TORCH = "torch==2.14.1"


@nox.session(python="3.11")
def tests(session: nox.Session) -> None:
    """The harness's own tests (CPU, gloo), two xdist workers."""
    session.install("--no-compile", CPU_TORCH, "-e", ".[test]")
    session.run("python", "-m", "pytest", "-n", "2", *session.posargs)


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    """ruff over the package, cases and tests (the repro templates' lines hold placeholders, so their length is
    the rendered file's business: tests/repro checks that)."""
    session.install("ruff")
    session.run("ruff", "check", "--select", "E,F,W,B", "--line-length", "120",
                "--per-file-ignores", "harness/repro/short_text.py:E501", "harness", "cases", "kernels",
                "tests", "noxfile.py", "setup.py")


BUILD_PYTHON_ENV = "SYNCBN_HARNESS_BUILD_PYTHON_{}"  # the version, dots as underscores: ..._PYTHON_2_14_1


def lent_python(session: nox.Session, torch_build: str) -> str | None:
    """The interpreter ``$SYNCBN_HARNESS_BUILD_PYTHON_<version>`` names for this build, if set: an environment
    that already holds that torch and this checkout (CI lends its test venv and the CUDA compile check's, so
    that no build is installed twice). Its torch must be the build's version."""
    version = torch_build.split("==", 1)[1]
    variable = BUILD_PYTHON_ENV.format(version.replace(".", "_"))
    python = os.environ.get(variable)
    if not python:
        return None
    found = session.run(python, "-c", "import torch; print(torch.__version__.split('+')[0])",
                        external=True, silent=True, success_codes=[0, 1])
    found = ((found or "").strip().splitlines() or ["no output"])[-1]
    if found != version:
        has = f"torch {found}" if found[:1].isdigit() else f"no importable torch ({found})"
        session.error(f"{variable}={python} has {has}, not {version}: name an environment with "
                      f"{torch_build} and this checkout installed, or unset {variable} to let the session "
                      "install them")
    return python


@nox.session(name="cuda_compile", python="3.11")
def cuda_compile(session: nox.Session) -> None:
    """Compile the CUDA kernels for sm_80 and sm_90 against the CUDA 13 build of torch (no GPU needed).

    Runs in the environment ``$SYNCBN_HARNESS_BUILD_PYTHON_2_14_1`` names where that is set (:func:`lent_python`:
    `.ci/run` installs it beside the tests' environment, the two installs at once), else installs its own."""
    python = lent_python(session, CUDA_TORCH)
    if python is None:
        session.install("--no-compile", CUDA_TORCH, "-e", ".")
    interpreter = python or "python"
    cache = os.path.join(session.virtualenv.location, "syncbn-cache")
    session.run(interpreter, "-m", "harness", "build-kernels", "--cuda", "--cuda-arch", "8.0;9.0",
                env={"SYNCBN_HARNESS_CACHE": cache, "MAX_JOBS": "2"}, external=python is not None)
    # The library that was built must load in a CUDA build of torch and expose CUDA kernels for every op.
    session.run(interpreter, "-c", (
        "import torch; from harness.kernels import extension; "
        "spec = extension.default_spec(cuda=True, cuda_archs='8.0;9.0'); extension.build(spec); "
        "ops = ['batch_norm_stats', 'batch_norm_gather_stats_with_counts', 'batch_norm_elemt', "
        "'batch_norm_backward_reduce', 'batch_norm_backward_elemt', 'welford_stats', 'welford_merge', "
        "'welford_finish']; "
        "missing = [o for o in ops if not torch._C._dispatch_has_kernel_for_dispatch_key("
        "'syncbn_ref::' + o, 'CUDA')]; "
        "assert not missing, missing; print('CUDA kernels registered for', len(ops), 'ops')"),
        env={"SYNCBN_HARNESS_CACHE": cache}, external=python is not None)


@nox.session(python="3.11")
@nox.parametrize("torch_build", [CPU_TORCH, CUDA_TORCH], ids=["torch-2.13.0", "torch-2.14.1"])
def builds(session: nox.Session, torch_build: str) -> None:
    """The default selection against torch 2.13.0 and 2.14.1 (each in its own venv) into one store, then the report.

    `nox -s builds` runs both builds in turn; each writes the cross-build report over the whole store
    afterwards, so the last one covers both. Extra arguments go to `run` (e.g. `-- --resume`). A build runs in
    the environment `$SYNCBN_HARNESS_BUILD_PYTHON_<version>` names where that is set (:func:`lent_python`).
    """
    python = lent_python(session, torch_build)
    if python is None:
        session.install("--no-compile", torch_build, "-e", ".")
    harness = [python, "-m", "harness"] if python else ["syncbn-harness"]
    store = os.environ.get("SYNCBN_HARNESS_STORE") or os.path.join("results", "builds")
    out = os.environ.get("SYNCBN_HARNESS_REPORTS") or os.path.join("reports", "builds")
    # The harness's own cache, as for any run: kernels and compiled graphs are keyed by the torch build, so a
    # build's kernels already made (by the tests, for torch 2.13.0) are used, not made again in each venv.
    env = {"MAX_JOBS": "2"}
    session.run(*harness, "env", env=env, external=True)
    # Known issues do not fail a run; anything else that fails (exit 1) fails the session, after the report is
    # written so that the failure can be read there.
    try:
        session.run(*harness, "run", "--device", "cpu", "--store", store, *session.posargs, env=env, external=True)
    finally:
        session.run(*harness, "report", "--store", store, "--out", out, env=env, external=True)


# ---------------------------------------------------------------------- the GPU suite

GPU_PYTHON_ENV = "SYNCBN_HARNESS_GPU_PYTHON"


@nox.session(python=False)
def gpu(session: nox.Session) -> None:
    """The GPU suite (`syncbn-harness gpu-suite`) in the Python that runs nox, or `$SYNCBN_HARNESS_GPU_PYTHON`.

    No virtualenv and no install: the suite runs where a CUDA torch and this harness are already installed
    (a lent GPU machine reaches no package index; `.ci/gpu-suite.sh` installs the checkout offline first).
    Arguments after `--` go to the suite (`-- --out DIR --apex-src PATH --emulated STORE --plan`). On a machine
    without a GPU, or with a CPU build of torch, the session fails with the reason (exit 3), never skips.
    """
    python = os.environ.get(GPU_PYTHON_ENV) or sys.executable
    session.run(python, "-m", "harness", "gpu-suite", *session.posargs, external=True)
