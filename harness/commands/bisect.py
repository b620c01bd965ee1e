"""``syncbn-harness bisect``: the first bad build between a good and a bad one."""

from __future__ import annotations

import json
import sys

import click

from harness.commands import cli
from harness.commands._options import selection_options


@cli.command()
@click.option("--good", required=True, metavar="SPEC",
              help="A build that passes: torch==X, a .whl, or /path/to/python.")
@click.option("--bad", required=True, metavar="SPEC", help="A build that fails the selection.")
@selection_options
@click.option("--package", default=None, help="The package whose releases are bisected (default: from --good, "
              "else torch).")
@click.option("--versions", "versions", multiple=True, metavar="V[,V...]",
              help="The candidate releases, instead of asking the index (repeatable or comma-separated).")
@click.option("--builds", "builds_file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="A file of SPECs in order, one a line; --good and --bad must be in it.")
@click.option("--find-links", multiple=True, metavar="DIR|URL", help="Passed to pip (repeatable).")
@click.option("--index-url", default=None, help="Passed to pip.")
@click.option("--extra-index-url", "extra_index_urls", multiple=True, help="Passed to pip (repeatable).")
@click.option("--no-index", is_flag=True, help="Passed to pip: only --find-links.")
@click.option("--pre", is_flag=True, help="Consider pre-releases.")
@click.option("--inherit/--no-inherit", default=None,
              help="Environments see this interpreter's packages (torch, the harness) behind their own. "
                   "Default: off when bisecting torch, on for any other package.")
@click.option("--rerun", is_flag=True, help="Ignore cached verdicts (environments are still reused).")
@click.option("--build-timeout", "eval_timeout", type=click.FloatRange(min=1), default=3600.0,
              help="Seconds for one build's run of the selection before it counts as untestable.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
def bisect(good, bad, selection, package, versions, builds_file, find_links, index_url, extra_index_urls, no_index,
           pre, inherit, rerun, eval_timeout, fmt):
    """Bisect builds (releases, wheels, interpreters) for the first that fails the selection.

    Exit 0 when the first bad build is found, 1 when an end is wrong (good not good, bad not bad).
    """
    from harness.bisect.bisector import Outcome
    from harness.bisect.builds import IndexOptions
    from harness.bisect.driver import bisect_builds

    index = IndexOptions(tuple(find_links), index_url, tuple(extra_index_urls), no_index, pre)
    result = bisect_builds(
        good=good, bad=bad, selection=selection, package=package,
        versions=[v for vs in versions for v in vs.split(",") if v.strip()], builds_file=builds_file, index=index,
        inherit=inherit, rerun=rerun, eval_timeout=eval_timeout, log=lambda s: click.echo(s, err=True))
    text = result.summary()
    if fmt == "json":
        click.echo(text, err=True)
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        click.echo(text)
    ends_wrong = result.result.outcome in (Outcome.GOOD_END_NOT_GOOD, Outcome.BAD_END_NOT_BAD)
    sys.exit(1 if ends_wrong else 0)
