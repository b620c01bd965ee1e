"""``syncbn-harness bisect-script``: a script for ``git bisect run`` (build step, then ``check``)."""

from __future__ import annotations

import shlex
import sys

import click

from harness.commands import cli
from harness.commands._options import selection_options


@cli.command("bisect-script")
@selection_options
@click.option("--build-cmd", default=None, metavar="CMD",
              help="Shell command run in the checkout first (e.g. 'python setup.py develop'); failure means skip.")
@click.option("--checkout-on-path", is_flag=True,
              help="Put the checkout first on PYTHONPATH for check (an implementation module that is not installed).")
@click.option("--build-timeout", type=click.FloatRange(min=1), default=4 * 3600.0, help="Seconds for the build step.")
@click.option("--check-timeout", type=click.FloatRange(min=1), default=3600.0, help="Seconds for check.")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Where to write the script.")
def bisect_script(selection, build_cmd, checkout_on_path, build_timeout, check_timeout, output):
    """Write an executable script for `git bisect run`: build (failure = 125), then check (>= 128 = 125)."""
    from harness.bisect.script import write_script

    if selection.case_patterns:
        selection.cases  # noqa: B018 - an unknown pattern is a usage error now, not at the first commit
    path = write_script(output, selection, build_cmd=build_cmd, checkout_on_path=checkout_on_path,
                        build_timeout=build_timeout, check_timeout=check_timeout,
                        command="syncbn-harness " + shlex.join(sys.argv[1:]))
    click.echo(f"wrote {path} (log: {path}.log); in the checkout: git bisect start BAD GOOD && git bisect run {path}")
