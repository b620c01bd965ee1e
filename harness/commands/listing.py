"""``syncbn-harness list cases|impls``: what can be selected, and what a selection would run."""

from __future__ import annotations

import json

import click

from harness.commands import cli
from harness.commands._options import CASE_HELP


@cli.command("list")
@click.argument("what", type=click.Choice(["cases", "impls"]))
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
@click.option("--case", "case_patterns", multiple=True, metavar="GLOB", help=CASE_HELP)
@click.option("--exhaustive", is_flag=True, help="The full generated product, not only the default selection.")
@click.option("--world-size", "world_sizes", type=click.IntRange(min=1), multiple=True,
              help="Only cases of this world size (repeatable).")
def list_cmd(what, fmt, case_patterns, exhaustive, world_sizes):
    """What can be selected: cases (id, family, params) or implementations (state, version, support).

    `list cases` takes the selection flags of `run`, so it shows exactly the cases a run would run.
    """
    if what == "cases":
        from harness import catalog

        cases = catalog.select(case_patterns, exhaustive=exhaustive, world_sizes=world_sizes)
        if fmt == "json":
            rows = [{"id": c.id, "family": c.family, "default": c.default, "params": c.params()} for c in cases]
            click.echo(json.dumps(rows, indent=2))
            return
        from harness.results.console import columns

        rows = [["case", "ws", "dtype", "layout", "batches", "default"]]
        for c in cases:
            rows.append([c.id, str(c.world_size), f"{c.dtype}/{c.param_dtype}", c.memory_format,
                         ",".join(map(str, c.batch_sizes)), "yes" if c.default else "no"])
        for line in columns(rows):
            click.echo(line)
        click.echo(f"{len(cases)} cases", err=True)
        return
    from harness import impls

    rows = [impls.resolve(name).describe() for name in impls.known_names()]
    if fmt == "json":
        click.echo(json.dumps(rows, indent=2))
        return
    from harness.results.console import columns

    table = [["impl", "version", "mode", "state"]]
    for r in rows:
        table.append([r["name"], r["version"] or "-", r["mode"] or "-",
                      r["state"] + (f": {r['reason']}" if r["reason"] else "")])
    for line in columns(table):
        click.echo(line)
