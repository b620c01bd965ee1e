"""``syncbn-harness run``: run a selection, store and print the records."""

from __future__ import annotations

import json
import sys

import click

from harness.cli import Selection, cli, default_store, selection_options


@cli.command()
@selection_options
@click.option("--store", "store_dir", type=click.Path(file_okay=False), default=None,
              help="Results store directory (default: $SYNCBN_HARNESS_STORE or ./results).")
@click.option("--resume", is_flag=True, help="Skip what the store already holds for this build and selection.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
@click.option("--junit", type=click.Path(dir_okay=False), default=None, help="Also write JUnit XML here.")
def run(impls, case_patterns, exhaustive, device, backend, world_sizes, timeout, store_dir, resume, fmt, junit):
    """Run the selected cases, store and print the records. Exit 1 on any unexpected failure."""
    from harness import records as rec
    from harness.output import print_table, write_junit
    from harness.runner import execute_run

    sel = Selection(impls, case_patterns, exhaustive, device, backend, world_sizes, timeout)

    def progress(record):
        if fmt == "table":
            click.echo(f"{record.status.value:<11} {record.case}  [{record.impl}]"
                       + (f"  {record.message}" if record.message and record.status != rec.Status.PASS else ""),
                       err=True)

    out, is_writer = execute_run(sel.cases, sel.impls(), sel.options, store_dir=store_dir or default_store(),
                                 resume=resume, on_record=progress)
    if not is_writer:
        sys.exit(0)  # a torchrun rank other than 0: rank 0 reports
    if fmt == "json":
        click.echo(json.dumps([r.to_dict() for r in out], indent=2))
    else:
        print_table(out)
    if junit:
        write_junit(out, junit)
    sys.exit(rec.exit_code(out))
