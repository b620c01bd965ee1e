"""``syncbn-harness diff BUILD_A BUILD_B``: what changed between two builds in the store."""

from __future__ import annotations

import json
import sys

import click

from harness.commands import cli
from harness.commands._options import default_store, growth_options, store_option


@cli.command()
@click.argument("build_a")
@click.argument("build_b")
@store_option()
@growth_options
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
@click.option("--all", "show_same", is_flag=True,
              help="Also list the cases that did not change and those only one build ran.")
@click.option("--fail-on-regression", is_flag=True,
              help="Exit 1 when B regressed against A (without it, diff only informs and exits 0).")
def diff(build_a, build_b, store_dir, growth, growth_floor, fmt, show_same, fail_on_regression):
    """Compare two builds of the store: new failures, fixed cases, status changes, error growth.

    BUILD_A and BUILD_B are build keys as in the store's file names (see `ls STORE`), or unambiguous prefixes.
    diff is informational (exit 0) unless --fail-on-regression; `gate` is the command for CI.
    """
    from harness.results.diff import format_changes

    changes, key_a, key_b = diff_builds(store_dir or default_store(), build_a, build_b,
                                        factor=growth, floor=growth_floor)
    if fmt == "json":
        click.echo(json.dumps({"a": key_a, "b": key_b, "changes": [c.to_dict() for c in changes]}, indent=2))
    else:
        click.echo(format_changes(changes, key_a, key_b, show_same=show_same))
    if fail_on_regression and any(c.regression for c in changes):
        sys.exit(1)


def diff_builds(store_dir, build_a: str, build_b: str, *, factor: float = 2.0, floor: float = 0.1):
    """The changes from build A to build B of a store, and the two resolved build keys."""
    from harness.results.diff import GrowthRule, changes
    from harness.results.store import Store, Where

    with Store(store_dir) as store:
        key_a, key_b = store.resolve_build(build_a), store.resolve_build(build_b)
        a, b = list(store.latest(Where(build=key_a))), list(store.latest(Where(build=key_b)))
    return changes(a, b, GrowthRule(factor, floor)), key_a, key_b
