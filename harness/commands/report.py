"""``syncbn-harness report``: HTML and Markdown over the store (its index), CSV per build on request."""

from __future__ import annotations

import click

from harness.commands import cli
from harness.commands._options import default_store, store_option


@cli.command()
@store_option()
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Where to write the report (default: $SYNCBN_HARNESS_REPORTS or ./reports).")
@click.option("--csv", "csv", is_flag=True,
              help="Also write every build's latest records and their compared tensors as CSV "
                   "(csv/<build>.records.csv, csv/<build>.metrics.csv).")
def report(store_dir, out_dir, csv):
    """Write a self-contained HTML page and a Markdown summary of the store's latest records (and CSV per build
    with --csv). The page stays small whatever the store holds: long tables are cut, with what they leave out
    and how to list it, and the plots show a sample."""
    from harness.results.report import default_out, write_report

    files = write_report(store_dir or default_store(), out_dir or default_out(), csv=csv)
    for path in (files.html, files.markdown, *files.csv):
        click.echo(str(path))
