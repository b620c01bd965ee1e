"""``syncbn-harness list cases|impls``: what can be selected."""

from __future__ import annotations

import json

import click

from harness.cli import cli


@cli.command("list")
@click.argument("what", type=click.Choice(["cases", "impls"]))
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
@click.option("--exhaustive", is_flag=True, help="List the full product, not only the default selection.")
def list_cmd(what, fmt, exhaustive):
    """What can be selected: cases (id, family, params) or implementations (state, version, support)."""
    from harness import catalog, impls

    if what == "cases":
        cases = catalog.select(exhaustive=exhaustive)
        rows = [{"id": c.id, "family": c.family, "default": c.default, "params": c.params()} for c in cases]
        if fmt == "json":
            click.echo(json.dumps(rows, indent=2))
        else:
            for c in cases:
                p = c.params()
                click.echo(f"{c.id:<60} ws={c.world_size} {p['dtype']}/{p['param_dtype']} {p['memory_format']} "
                           f"batches={p['batch_sizes']}")
            click.echo(f"{len(cases)} cases", err=True)
        return
    rows = [impls.resolve(name).describe() for name in impls.known_names()]
    if fmt == "json":
        click.echo(json.dumps(rows, indent=2))
    else:
        for r in rows:
            state = r["state"] + (f" ({r['reason']})" if r["reason"] else "")
            click.echo(f"{r['name']:<12} {r['version'] or '-':<14} {r['mode'] or '-':<14} {state}")
