"""``syncbn-harness cache list|prune``: what the harness cache holds, and removing what is old or too much."""

from __future__ import annotations

import datetime

import click

from harness.commands import cli
from harness.results.console import format_size

KIND_NAMES = ("kernels", "environments", "overlays", "compile", "bisect", "logs", "torchrun", "indexes", "uv",
              "apex", "sources")


def _when(t: float) -> str:
    return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M")


@cli.group()
def cache():
    """The harness cache (built kernels, bisection environments, overlays, compile caches, logs): list, prune."""


@cache.command("list")
@click.option("--kind", "kinds", multiple=True, type=click.Choice(KIND_NAMES), help="Only this kind (repeatable).")
@click.option("--entries", "show_entries", is_flag=True, help="One line per entry, not per kind.")
def list_cmd(kinds, show_entries):
    """Per kind: entries, size, oldest and newest use (or each entry with --entries)."""
    from harness.cache import entries
    from harness.paths import cache_root

    listed = entries(kinds)
    if show_entries:
        for e in listed:
            click.echo(f"{e.kind:13s} {format_size(e.bytes):>9}  {_when(e.last_use)}  {e.path}")
    else:
        click.echo(f"{'kind':13s} {'entries':>7}  {'size':>9}  {'oldest use':16s}  newest use")
        for kind in kinds or KIND_NAMES:
            mine = [e for e in listed if e.kind == kind]
            if mine:
                click.echo(f"{kind:13s} {len(mine):>7}  {format_size(sum(e.bytes for e in mine)):>9}  "
                           f"{_when(mine[0].last_use):16s}  {_when(mine[-1].last_use)}")
    click.echo(f"{len(listed)} entries, {format_size(sum(e.bytes for e in listed))} in {cache_root()}")


@cache.command()
@click.option("--kind", "kinds", multiple=True, type=click.Choice(KIND_NAMES), help="Only this kind (repeatable).")
@click.option("--older-than", metavar="AGE", default=None, help="Remove entries last used more than AGE ago (30d, "
              "12h, 2w).")
@click.option("--max-size", metavar="SIZE", default=None,
              help="Then remove the least recently used until the kinds chosen fit in SIZE (20G, 500M).")
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
def prune(kinds, older_than, max_size, dry_run):
    """Remove old entries, or the least recently used beyond a size; never one being made (its lock is held) or
    one a running process uses (its folder, an open or mapped file in it)."""
    from harness.cache import parse_age, parse_size
    from harness.cache import prune as prune_cache

    done = prune_cache(kinds, parse_age(older_than) if older_than else None,
                       parse_size(max_size) if max_size else None, dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    for e in done.removed:
        click.echo(f"{verb} {e.kind:13s} {format_size(e.bytes):>9}  {_when(e.last_use)}  {e.path}")
    for e, why in done.skipped:
        click.echo(f"kept    {e.kind:13s} {format_size(e.bytes):>9}  {e.path}: {why}")
    click.echo(f"{verb} {len(done.removed)} entries, {format_size(sum(e.bytes for e in done.removed))}"
               + (f"; kept {len(done.skipped)} in use" if done.skipped else ""))
