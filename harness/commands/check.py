"""``syncbn-harness check``: the ``git bisect run`` verdict (0 good, 1 bad, 125 untestable).

Protocol: whatever happens, ``check`` exits 0, 1 or 125, never 2 (which git
reads as bad) and never 128 or more (which aborts the bisect), with one
deliberate exception: Ctrl-C (SIGINT) exits 130 to stop the bisection, as the
user asked. In detail:
- the check runs in a worker process, the only one that imports torch: a
  build whose torch crashes on import (SIGSEGV, SIGABRT), or anything else
  that kills the worker, is 125, not a crash of ``check``;
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

import os
import signal
import subprocess
import sys
from typing import Optional

import click

from harness.commands import EXIT_INTERRUPTED, cli
from harness.commands._options import selection_options, start_ranks_early
from harness.errors import EXIT_UNTESTABLE, HarnessError, Terminated
from harness.paths import CHECK_WORKER, setting

WORKER_STOP_S = 30.0  # after SIGTERM or Ctrl-C, the worker's time to reap its ranks before it is killed


@cli.command()
@selection_options
def check(selection):
    """For `git bisect run`: exit 0 good, 1 bad, 125 cannot test (never 128 or more)."""
    worker = setting(CHECK_WORKER)
    if worker:
        sys.exit(check_exit_code(selection, imported_fd=int(worker)))
    sys.exit(supervise(selection))


def supervise(selection) -> int:
    """Run the check in a worker process and turn its exit into 0, 1, 125 or 130.

    The worker is the one process that imports torch: this one never does, so a torch that kills its
    importer (SIGSEGV, SIGABRT) costs the worker, and the verdict is 125. The worker starts the ranks'
    forkserver before importing torch itself, so the two imports overlap (one torch import on the path to
    the first case, not three). SIGTERM here is passed on (the worker answers 125); Ctrl-C reaches the worker
    from the terminal (or is passed on) and ends in 130.
    """
    import shutil
    import tempfile

    cmd = [sys.executable, "-m", "harness", "check", *selection.argv()]
    # The worker's temporary files (multiprocessing's, the pools' folders) go into a folder of this process,
    # removed when the worker is done, however it ended: a worker killed by a signal cannot clean up.
    scratch = tempfile.mkdtemp(prefix="syncbn-check-")
    imported_r, imported_w = os.pipe()  # the worker writes one byte once torch is imported
    try:
        proc = subprocess.Popen(cmd, env={**os.environ, CHECK_WORKER: str(imported_w), "TMPDIR": scratch},
                                pass_fds=(imported_w,))
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    finally:
        os.close(imported_w)
    os.set_blocking(imported_r, False)  # a leaked write end elsewhere must not make the read below wait
    try:
        with open(imported_r, "rb") as imported:
            code = _await_worker(proc)
            torch_imported = code < 0 and bool(imported.read(1))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if code == -signal.SIGINT:
        return EXIT_INTERRUPTED
    if code >= 0:
        return code
    what = "running the cases" if torch_imported else "importing torch"
    click.echo(f"check: cannot test: {what} killed the check's worker process ({signal.Signals(-code).name})",
               err=True)
    return EXIT_UNTESTABLE


def _await_worker(proc: subprocess.Popen) -> int:
    """Wait for the worker; its exit as 0, 1, 125 or 130, or minus the signal that killed it."""
    try:
        code = _wait(proc)
    except Terminated:
        proc.send_signal(signal.SIGTERM)
        _wait(proc, WORKER_STOP_S)
        click.echo("check: terminated; cannot test", err=True)
        return EXIT_UNTESTABLE
    except KeyboardInterrupt:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        _wait(proc, WORKER_STOP_S)
        return EXIT_INTERRUPTED
    if code in (0, 1, EXIT_UNTESTABLE, EXIT_INTERRUPTED) or code < 0:
        return code
    click.echo(f"check: the check's worker process exited {code}; cannot test", err=True)
    return EXIT_UNTESTABLE


def _wait(proc: subprocess.Popen, timeout: Optional[float] = None) -> int:
    """The worker's exit status; after ``timeout`` seconds it is killed (and reaped) instead."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def torch_import_problem() -> Optional[str]:
    """Why torch cannot be imported in this process (None when it can): an exception, not a crash."""
    try:
        import torch  # noqa: F401
        import torch.distributed  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - whatever a broken build raises
        return f"importing torch failed: {type(exc).__name__}: {exc}"
    return None


def check_exit_code(selection, imported_fd: Optional[int] = None) -> int:
    """The verdict of ``check`` as an exit code (see the module docstring); ``imported_fd``: a pipe this
    worker writes one byte to once torch is imported (so its supervisor can tell what a crash interrupted)."""
    from harness.results.verdict import Verdict, judge

    records: list = []

    def so_far() -> int:  # a failure already seen stays bad, whatever stopped the run
        return Verdict.BAD.exit_code if judge(records).verdict is Verdict.BAD else EXIT_UNTESTABLE

    try:
        launcher = start_ranks_early(selection)
        problem = torch_import_problem()
        if problem:
            click.echo(f"check: cannot test: {problem}", err=True)
            return EXIT_UNTESTABLE
        if imported_fd is not None:
            os.write(imported_fd, b"t")
            os.close(imported_fd)
        from harness.engine.plan import execute, make_plan

        def on_record(r) -> None:
            records.append(r)
            if r.ran and r.failed:
                click.echo(f"check: {r.status.value} {r.case} [{r.impl}] {r.message}", err=True)
            elif r.ran and r.known:
                click.echo(f"check: {r.status.value} as known ({r.known_issue.link}) {r.case} [{r.impl}]", err=True)

        _, is_writer = execute(make_plan(selection, diagnose=False, launcher=launcher), on_record=on_record)
        if not is_writer:
            return 0  # a torchrun rank other than the writer: the writer gives the verdict
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
