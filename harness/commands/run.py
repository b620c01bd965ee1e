"""``syncbn-harness run``: run a selection, store and print the records."""

from __future__ import annotations

import json
import os
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
@click.option("--compare", default=None, metavar="A,B",
              help="A's records also say how A differs from B on the same inputs (both are run).")
@click.option("-v", "--verbose", is_flag=True, help="List every record in the table, not only those that did not pass.")
def run(impls, case_patterns, exhaustive, device, backend, world_sizes, timeout, store_dir, resume, fmt, junit,
        compare, verbose):
    """Run the selected cases, store and print the records. Exit 1 on any unexpected failure."""
    from harness import records as rec
    from harness import torchrun
    from harness.output import print_table, status_label, write_junit
    from harness.progress import Progress, wanted
    from harness.runner import execute_run

    sel = Selection(impls, case_patterns, exhaustive, device, backend, world_sizes, timeout)
    if compare:
        pair = parse_compare(compare)
        sel.impl_names += [n for n in pair if n not in sel.impl_names]
        sel.options.compare = pair
    impl_objs = sel.impls()
    store_dir = store_dir or default_store()
    total = len(sel.cases) * len(impl_objs)
    if torchrun.under_torchrun():
        world = int(os.environ["WORLD_SIZE"])  # torchrun runs only the cases of its world size
        total = sum(c.world_size == world for c in sel.cases) * len(impl_objs)
    else:
        todo = planned(store_dir, sel, impl_objs, resume)
        if resume and not todo and sel.cases:
            click.echo(f"resume: the store {store_dir} already holds all {total} (case, impl) results of this "
                       "selection for this build; nothing left to run (see them with `syncbn-harness report`, "
                       "or run without --resume to run them again)", err=True)
            if fmt == "json":
                click.echo("[]")
            sys.exit(0)
        if resume and len(todo) < total:
            click.echo(f"resume: {total - len(todo)} of {total} (case, impl) results already in {store_dir}; "
                       f"running the {len(todo)} left", err=True)
        total = len(todo)

    with Progress(total, enabled=wanted(sys.stderr, fmt)) as bar:
        def on_record(record):
            bar.update(record)
            if fmt == "json" or (bar.enabled and record.status == rec.Status.PASS):
                return  # the progress line counts passes; log lines are for what needs a look
            bar.write(f"{status_label(record):<14} {record.case}  [{record.impl}]"
                      + (f"  {record.message}" if record.message and record.status != rec.Status.PASS else ""))

        out, is_writer = execute_run(sel.cases, impl_objs, sel.options, store_dir=store_dir, resume=resume,
                                     on_record=on_record)
    if not is_writer:
        sys.exit(0)  # a torchrun rank other than 0: rank 0 reports
    if fmt == "json":
        click.echo(json.dumps([r.to_dict() for r in out], indent=2))
    else:
        print_table(out, verbose=verbose)
    if junit:
        write_junit(out, junit)
    sys.exit(rec.exit_code(out))


def parse_compare(value: str) -> tuple[str, str]:
    """``A,B`` -> (A, B); anything else is a usage error naming the value."""
    from harness.errors import UsageError

    parts = [p.strip() for p in value.split(",")]
    if len(parts) != 2 or not all(parts) or parts[0] == parts[1]:
        raise UsageError(f"--compare {value!r}: give two different implementations, e.g. --compare torch,reference")
    return parts[0], parts[1]


def planned(store_dir, sel: Selection, impl_objs, resume: bool) -> list[tuple[str, str]]:
    """The (case, impl) pairs this run will run; checks first that the store can take them.

    Refuses (StoreError, exit 3) a store that is not writable or whose file
    for this build holds records of a newer schema, before any case runs.
    """
    from harness.buildinfo import build_info
    from harness.store import Store, build_key, completed, pending

    info = build_info()
    key = build_key(info.torch_version, info.torch_git_version, sel.options.device, sel.options.resolved_backend)
    store = Store(store_dir)
    store.prepare(key)
    done = completed(store.read(key)) if resume else set()
    return pending([c.id for c in sel.cases], [i.name for i in impl_objs], done)
