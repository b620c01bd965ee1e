"""``syncbn-harness check``: the ``git bisect run`` verdict (0 good, 1 bad, 125 untestable)."""

from __future__ import annotations

import sys

import click

from harness.cli import EXIT_UNTESTABLE, Selection, cli, selection_options
from harness.errors import HarnessError


@cli.command()
@selection_options
def check(impls, case_patterns, exhaustive, device, backend, world_sizes, timeout):
    """For `git bisect run`: exit 0 good, 1 bad, 125 cannot test (never 128 or more)."""
    sys.exit(check_exit_code(impls, case_patterns, exhaustive, device, backend, world_sizes, timeout))


def check_exit_code(impls, case_patterns, exhaustive, device, backend, world_sizes, timeout) -> int:
    """The verdict of ``check`` as an exit code; every failure of the harness itself is 125."""
    try:
        from harness import records as rec
        from harness import runner

        sel = Selection(impls, case_patterns, exhaustive, device, backend, world_sizes, timeout)
        impl_objs = sel.impls()
        if not sel.cases:
            click.echo("check: nothing selected; cannot test", err=True)
            return EXIT_UNTESTABLE
        out = list(runner.run_selection(sel.cases, impl_objs, sel.options))
        runnable = [r for r in out if r.status not in (rec.Status.SKIPPED, rec.Status.UNSUPPORTED)]
        if not runnable:
            click.echo("check: every selected (case, impl) was skipped or unsupported; cannot test", err=True)
            return EXIT_UNTESTABLE
        bad = [r for r in out if r.failed]
        for r in bad:
            click.echo(f"check: {r.status.value} {r.case} [{r.impl}] {r.message}", err=True)
        click.echo(f"check: {len(runnable) - len(bad)} good, {len(bad)} bad", err=True)
        return 1 if bad else 0
    except HarnessError as exc:
        click.echo(f"check: cannot test: {exc}", err=True)
        return EXIT_UNTESTABLE
    except Exception as exc:  # noqa: BLE001 - a harness failure must never abort a bisect (exit >= 128)
        import traceback

        traceback.print_exc()
        click.echo(f"check: harness failure ({type(exc).__name__}: {exc}); cannot test", err=True)
        return EXIT_UNTESTABLE
