"""``syncbn-harness check``: the ``git bisect run`` verdict (0 good, 1 bad, 125 untestable).

Protocol: whatever happens, ``check`` exits 0, 1 or 125, never 2 (which git
reads as bad) and never 128 or more (which aborts the bisect), with one
deliberate exception: Ctrl-C (SIGINT) exits 130 to stop the bisection, as the
user asked. In detail:
- torch is first imported in a child process: a build whose torch crashes on
  import (SIGSEGV, SIGABRT) is 125, not a crash of ``check``;
- a usage error, a build of the kernels that fails, an implementation that
  does not import, an empty selection, or any failure of the harness: 125;
- SIGTERM (a timeout wrapper): 125;
- records are judged as they arrive: a failure already seen stays a 1 even if
  the harness fails later (a pool that cannot restart, say);
- a known issue that fails as expected is good, and is said so.
The console entry point (:mod:`harness.__main__`) keeps this promise even when
the harness itself cannot be imported or the command line does not parse.
"""

from __future__ import annotations

import subprocess
import sys

import click

from harness.commands import cli
from harness.commands._options import selection_options
from harness.errors import HarnessError, Terminated

EXIT_UNTESTABLE = 125
TORCH_IMPORT_TIMEOUT_S = 600


@cli.command()
@selection_options
def check(selection):
    """For `git bisect run`: exit 0 good, 1 bad, 125 cannot test (never 128 or more)."""
    sys.exit(check_exit_code(selection))


def torch_import_problem() -> str | None:
    """Import torch in a child process; why it cannot be imported here, or None."""
    try:
        proc = subprocess.run([sys.executable, "-c", "import torch, torch.distributed"], capture_output=True,
                              text=True, timeout=TORCH_IMPORT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"importing torch took more than {TORCH_IMPORT_TIMEOUT_S}s"
    if proc.returncode == 0:
        return None
    if proc.returncode < 0:
        import signal

        return f"importing torch killed the process ({signal.Signals(-proc.returncode).name})"
    tail = proc.stderr.strip().splitlines()[-1:] or ["(no message)"]
    return f"importing torch failed: {tail[0]}"


def check_exit_code(selection) -> int:
    """The verdict of ``check`` as an exit code (see the module docstring)."""
    from harness.results.verdict import Verdict, judge

    records: list = []

    def so_far() -> int:  # a failure already seen stays bad, whatever stopped the run
        return Verdict.BAD.exit_code if judge(records).verdict is Verdict.BAD else EXIT_UNTESTABLE

    try:
        problem = torch_import_problem()
        if problem:
            click.echo(f"check: cannot test: {problem}", err=True)
            return EXIT_UNTESTABLE
        from harness.engine.session import run_selection

        impls = selection.resolve_impls()
        for r in run_selection(selection.cases, impls, selection.run_options(diagnose=False)):
            records.append(r)
            if r.ran and r.failed:
                click.echo(f"check: {r.status.value} {r.case} [{r.impl}] {r.message}", err=True)
            elif r.ran and r.known:
                click.echo(f"check: {r.status.value} as known ({r.known_issue.link}) {r.case} [{r.impl}]", err=True)
        judgement = judge(records)
        if judgement.verdict is Verdict.SKIP:
            click.echo(f"check: {judgement.reason}; cannot test", err=True)
        else:
            known = judgement.known
            click.echo(f"check: {judgement.passed} good, {len(judgement.bad)} bad"
                       + (f", {known} failed as known issues (good)" if known else ""), err=True)
        return judgement.verdict.exit_code
    except Terminated:
        click.echo("check: terminated; cannot test", err=True)
        return so_far()
    except (HarnessError, click.ClickException) as exc:
        click.echo(f"check: cannot test: {exc}", err=True)
        return so_far()
    except Exception as exc:  # noqa: BLE001 - a harness failure must never abort a bisect (exit >= 128)
        import traceback

        traceback.print_exc()
        click.echo(f"check: harness failure ({type(exc).__name__}: {exc}); cannot test", err=True)
        return so_far()
