"""``syncbn-harness env``: the build under test."""

from __future__ import annotations

import json

import click

from harness.commands import cli


@cli.command()
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
def env(fmt):
    """The build under test: torch, CUDA, backends, kernel build state, apex state."""
    from harness.buildinfo import environment

    data = environment()
    if fmt == "json":
        click.echo(json.dumps(data, indent=2))
        return
    width = max(len(k) for k in data)
    for key, value in data.items():
        if isinstance(value, (list, tuple)):
            value = ", ".join(map(str, value)) or "none"
        click.echo(f"{key:<{width}}  {value if value is not None else 'none'}")
