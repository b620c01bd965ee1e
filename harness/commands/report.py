"""``syncbn-harness report``: HTML, Markdown and CSV over the store."""

from __future__ import annotations

import click

from harness.commands import cli
from harness.commands._options import default_store, store_option


@cli.command()
@store_option()
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Where to write the report (default: $SYNCBN_HARNESS_REPORTS or ./reports).")
def report(store_dir, out_dir):
    """Write a self-contained HTML page, a Markdown summary and CSV of the store's records."""
    from harness.results.report import default_out, write_report

    files = write_report(store_dir or default_store(), out_dir or default_out())
    for path in (files.html, files.markdown, files.csv, files.metrics_csv):
        click.echo(str(path))
