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
@click.option("--history", "history_source", type=click.Path(exists=True), default=None, metavar="SOURCE",
              help="Write the page of a history across releases instead: SOURCE is a store `history` filled "
                   "(its history.jsonl.gz is written into --out too) or a history.jsonl.gz.")
def report(store_dir, out_dir, csv, history_source):
    """Write a self-contained HTML page and a Markdown summary of the store's latest records (and CSV per build
    with --csv). The page stays small whatever the store holds: long tables are cut, with what they leave out
    and how to list it, and the plots show a sample. With --history, the page of a history across releases."""
    from harness.results.report import default_out, write_report

    if history_source:
        from pathlib import Path

        from harness.history.report import write_history_report

        for path in write_history_report(Path(history_source), Path(out_dir or default_out())):
            click.echo(str(path))
        return

    files = write_report(store_dir or default_store(), out_dir or default_out(), csv=csv)
    for path in (files.html, files.markdown, *files.csv):
        click.echo(str(path))
