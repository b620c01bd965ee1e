"""``syncbn-harness store stats|compact``: what the store's files hold, and dropping superseded records."""

from __future__ import annotations

import json

import click

from harness.commands import cli
from harness.results.console import format_size
from harness.commands._options import default_store, store_option


@cli.group()
def store():
    """The results store's files: what they hold (stats) and dropping superseded records (compact)."""


@store.command()
@store_option()
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
def stats(store_dir, fmt):
    """Per build file: records, the latest per (implementation, case) that readers read, superseded records a
    compaction drops, lines that are not records, and bytes."""
    from harness.results.compaction import stats as file_stats

    where = store_dir or default_store()
    rows = file_stats(where)
    if fmt == "json":
        click.echo(json.dumps([{"build": r.key, "bytes": r.bytes, "records": r.records, "latest": r.latest,
                                "superseded": r.superseded, "torn": r.torn} for r in rows], indent=2))
        return
    width = max([len(r.key) for r in rows] + [5])
    click.echo(f"{'build':<{width}}  {'records':>8}  {'latest':>8}  {'superseded':>10}  {'torn':>5}  {'bytes':>9}")
    for r in rows:
        click.echo(f"{r.key:<{width}}  {r.records:>8}  {r.latest:>8}  {r.superseded:>10}  {r.torn:>5}  "
                   f"{format_size(r.bytes):>9}")
    total = sum(r.bytes for r in rows)
    click.echo(f"{len(rows)} builds, {sum(r.records for r in rows)} records "
               f"({sum(r.superseded for r in rows)} superseded), {format_size(total)} in {where}")


@store.command()
@click.argument("builds", nargs=-1)
@store_option()
def compact(builds, store_dir):
    """Keep only the latest record of each (implementation, case) in each build file (BUILDS: keys or
    unambiguous prefixes; default every file), rewritten atomically under the file's lock."""
    from harness.results.compaction import compact as compact_store

    where = store_dir or default_store()
    for c in compact_store(where, builds):
        torn = f", {c.torn_dropped} torn line(s) dropped" if c.torn_dropped else ""
        click.echo(f"{c.key}: {c.records_before} -> {c.records_after} records, {format_size(c.bytes_before)} -> "
                   f"{format_size(c.bytes_after)}{torn}")
