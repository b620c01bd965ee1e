"""``syncbn-harness diff BUILD_A BUILD_B``: what changed between two builds in the store."""

from __future__ import annotations

import json

import click

from harness.cli import cli, default_store


def growth_options(fn):
    """``--growth`` and ``--growth-floor``: when a larger worst err/tol counts as error growth."""
    fn = click.option("--growth-floor", type=click.FloatRange(min=0.0), default=0.1, show_default=True,
                      help="Growth is measured from at least this worst err/tol: a case grows only past "
                      "--growth x this.")(fn)
    fn = click.option("--growth", type=click.FloatRange(min=1.0), default=2.0, show_default=True,
                      help="Error growth: the worst err/tol ratio grew by more than this factor.")(fn)
    return fn


@cli.command()
@click.argument("build_a")
@click.argument("build_b")
@click.option("--store", "store_dir", type=click.Path(file_okay=False), default=None,
              help="Results store directory (default: $SYNCBN_HARNESS_STORE or ./results).")
@growth_options
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
@click.option("--all", "show_same", is_flag=True,
              help="Also list the cases that did not change and those only one build ran.")
def diff(build_a, build_b, store_dir, growth, growth_floor, fmt, show_same):
    """Compare two builds of the store: new failures, fixed cases, status changes, error growth.

    BUILD_A and BUILD_B are build keys as in the store's file names (see `ls STORE`), or unambiguous prefixes.
    """
    changes, key_a, key_b = diff_builds(store_dir or default_store(), build_a, build_b,
                                        factor=growth, floor=growth_floor)
    from harness.builddiff import format_changes

    if fmt == "json":
        click.echo(json.dumps({"a": key_a, "b": key_b, "changes": [c.to_dict() for c in changes]}, indent=2))
    else:
        click.echo(format_changes(changes, key_a, key_b, show_same=show_same))


def diff_builds(store_dir, build_a: str, build_b: str, *, factor: float = 2.0, floor: float = 0.1):
    """The changes from build A to build B of a store, and the two resolved build keys."""
    from harness.builddiff import GrowthRule, compare
    from harness.store import Store

    store = Store(store_dir)
    key_a, key_b = store.resolve_build(build_a), store.resolve_build(build_b)
    return compare(store.read(key_a), store.read(key_b), GrowthRule(factor, floor)), key_a, key_b
