"""``syncbn-harness run``: run a selection, store and print the records."""

from __future__ import annotations

import json
import shlex
import sys

import click

from harness.commands import cli
from harness.commands._options import default_store, selection_options, start_ranks_early, store_option


@cli.command()
@selection_options
@store_option()
@click.option("--resume", is_flag=True, help="Run only what the store does not hold yet for this build; the output "
              "then covers the whole selection.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
              help="json: the records as one JSON array on stdout (progress and logs on stderr).")
@click.option("--junit", type=click.Path(dir_okay=False), default=None, help="Also write JUnit XML here.")
@click.option("--compare", default=None, metavar="A,B",
              help="A's records also say how A differs from B on the same inputs (both are run).")
@click.option("-v", "--verbose", is_flag=True, help="List every record in the table, not only those that need a look.")
@click.option("--no-diagnose", is_flag=True,
              help="Do not run an unexpected crash or hang a second time with TORCH_DISTRIBUTED_DEBUG=DETAIL (the "
                   "second run's messages go into the record as its diagnosis; the status is the first run's).")
def run(selection, store_dir, resume, fmt, junit, compare, verbose, no_diagnose):
    """Run the selected cases, store and print the records.

    Exit 0 when nothing failed unexpectedly (known issues do not count), 1 on any mismatch, error, crash or hang
    that is not a known issue, 2 on a usage error, 3 when the harness could not work.
    """
    launcher = start_ranks_early(selection)
    from harness.engine.plan import execute, make_plan
    from harness.errors import Terminated
    from harness.results.console import cut
    from harness.results.progress import Progress, wanted
    from harness.judge.status import Status
    from harness.results.verdict import exit_code

    store_dir = store_dir or default_store()
    plan = make_plan(selection, store_dir=store_dir, resume=resume,
                     compare=parse_compare(compare) if compare else None, diagnose=not no_diagnose,
                     launcher=launcher)
    if resume and plan.launcher.announces:
        total, left = plan.selected, plan.to_run
        if not left:
            click.echo(f"resume: all {total} (case, impl) results of this selection are already in {store_dir}; "
                       "nothing left to run (the output below is of the stored records)", err=True)
        elif left < total:
            click.echo(f"resume: {total - left} of {total} (case, impl) results already in {store_dir}; "
                       f"running the {left} left (the output below covers all {total})", err=True)

    def output(records) -> None:
        if fmt == "json":
            click.echo(json.dumps([r.to_dict() for r in records], indent=2))
        else:
            from harness.results.console import print_table

            print_table(records, verbose=verbose)
        if junit:
            from harness.results import junit as junit_xml

            junit_xml.write(junit_xml.run_rows(records), junit)
        next_steps(records, selection, err=fmt == "json")

    with Progress(plan.to_run, enabled=wanted(sys.stderr, fmt)) as bar:
        announced: set = set()

        def on_record(record):
            bar.update(record)
            if fmt == "json" or record.status == Status.PASS or record.known:
                return  # the progress line counts these; log lines are for what needs a look
            if not record.ran:  # one line per implementation that cannot run here, not one per record
                key = (record.impl, record.status, record.message)
                if key not in announced:
                    announced.add(key)
                    bar.write(cut(f"{record.status.value:<14} {record.impl}: {record.message}"))
                return
            bar.write(cut(f"{record.label:<14} {record.case}  [{record.impl}]"
                          + (f"  {record.message.splitlines()[0]}" if record.message else "")))

        try:
            records, is_writer = execute(plan, on_record=on_record, on_abort=output)
        except (KeyboardInterrupt, Terminated):
            bar.close()
            again = ["syncbn-harness", *sys.argv[1:]] + ([] if "--resume" in sys.argv else ["--resume"])
            click.echo(f"the results finished so far are stored in {store_dir}; to continue: {shlex.join(again)}",
                       err=True)
            raise
    if not is_writer:
        sys.exit(0)  # a torchrun rank other than the writer: the writer reports
    records = plan.output(records)
    output(records)
    sys.exit(exit_code(records))


def parse_compare(value: str) -> tuple[str, str]:
    """``A,B`` -> (A, B); anything else is a usage error naming the value."""
    from harness.errors import UsageError

    parts = [p.strip() for p in value.split(",")]
    if len(parts) != 2 or not all(parts) or parts[0] == parts[1]:
        raise UsageError(f"--compare {value!r}: give two different implementations, e.g. --compare torch,reference")
    return parts[0], parts[1]


def next_steps(records, selection, err: bool) -> None:
    """After a failing run: the command that writes a standalone repro of the first failure."""
    failed = [r for r in records if r.failed]
    if not failed:
        return
    first = failed[0]
    device = f" --device {first.device}" if first.device != "cuda" and first.impl != "torch" else ""
    click.echo(f"\nto reproduce the first failure as a short standalone file:\n  syncbn-harness repro {first.case} "
               f"--impl {shlex.quote(first.impl)}{device} -o repro.py", err=err)
