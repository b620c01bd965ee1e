"""``syncbn-harness promote``: a search summary's findings into the catalog (what ``search --save`` does)."""

from __future__ import annotations

import click

from harness.commands import cli


@cli.command()
@click.argument("summary", type=click.Path(exists=True, dir_okay=False), metavar="FINDINGS_JSON")
@click.option("--finding", "numbers", type=click.IntRange(min=1), multiple=True,
              help="Only this finding, numbered as findings.md lists them (repeatable). Default: every new one.")
def promote(summary, numbers):
    """Promote the minimal cases of a search's findings (reports/search/findings.json) into the catalog.

    They join the search family in the default selection, so run, gate, check and repro select them by ID.
    """
    from harness.buildinfo import build_info
    from harness.search.promote import from_summary
    from harness.search.promote import promote as add

    path, added = add(from_summary(summary, numbers), build=build_info())
    for case_id in added:
        click.echo(f"promoted {case_id}")
    click.echo(f"{len(added)} case(s) added to {path}" if added else f"nothing new to add to {path}: every case "
               "given is there already")
