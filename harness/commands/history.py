"""``syncbn-harness history``: the selection across torch releases, into one store (resumable)."""

from __future__ import annotations

from pathlib import Path

import click

from harness.commands import cli
from harness.commands._options import selection_options
from harness.errors import UsageError

FIRST_RELEASE = "1.13"


@cli.command()
@click.option("--store", "store_dir", type=click.Path(file_okay=False), required=True,
              help="The history's store: one file per release, and history.json saying what happened to each.")
@click.option("--first", default=FIRST_RELEASE, show_default=True, metavar="VERSION",
              help="The oldest minor release to cover.")
@click.option("--last", default=None, metavar="VERSION",
              help="The newest release to cover. Default: the torch pip would install here.")
@click.option("--release", "releases", multiple=True, metavar="VERSION",
              help="Exactly these releases instead of the latest patch of each minor (repeatable).")
@click.option("--keep-envs", is_flag=True, help="Keep each release's environment (default: removed after its run).")
@click.option("--rerun", is_flag=True, help="Run releases the store already holds again, every case (default: "
                                            "skip them).")
@click.option("--update", is_flag=True, help="Run releases the store already holds for the cases they lack only "
                                             "(the catalog grew since).")
@click.option("--installer", type=click.Choice(["auto", "pip", "uv"]), default="auto", show_default=True,
              help="What installs each release: uv (one cache of unpacked wheels, hard-linked) when on PATH.")
@click.option("--dry-run", is_flag=True, help="Print the releases it would cover, and stop.")
@selection_options
def history(store_dir, first, last, releases, keep_envs, rerun, update, installer, dry_run, selection):
    """Run the selection (default: the default selection of torch and the reference) on the latest patch of
    every minor torch release from --first to --last, each in its own environment, into one store. A release
    the store holds already is skipped; progress and disk use are printed per release. Exit 1 when a release
    could not be run (the manifest, history.json, says why); `report --history` makes the page."""
    from harness.bisect.builds import IndexOptions, available_versions
    from harness.history.collect import collect
    from harness.history.releases import minor_releases, newest_installable

    if rerun and update:
        raise UsageError("--rerun and --update: give one (--rerun runs every case again, --update the missing)")
    if not selection.impls:
        from dataclasses import replace

        selection = replace(selection, impls=("torch", "reference"))
    if releases:
        from packaging.version import InvalidVersion, Version

        for r in releases:
            try:
                Version(r)
            except InvalidVersion:
                raise UsageError(f"--release {r!r} is not a torch version: give one such as 2.1.2 or 2.13.0+cpu") \
                    from None
        chosen = list(releases)
    else:
        newest = last or newest_installable()
        chosen = minor_releases(available_versions("torch", IndexOptions()), first, newest)
    click.echo(f"history of {len(chosen)} release{'s' if len(chosen) != 1 else ''}: {', '.join(chosen)}")
    if dry_run:
        return
    outcomes = collect(chosen, Path(store_dir), selection, keep_envs=keep_envs, rerun=rerun, update=update,
                       installer=installer, log=lambda s: click.echo(s, err=True))
    failed = [o for r, o in outcomes.items() if r in chosen and o.status != "stored"]
    for o in failed:
        click.echo(f"torch=={o.release}: not stored: {o.reason}")
    click.echo(f"{len(chosen) - len(failed)} of {len(chosen)} releases stored in {store_dir}")
    raise SystemExit(1 if failed else 0)
