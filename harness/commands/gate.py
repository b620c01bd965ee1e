"""``syncbn-harness gate --baseline FILE``: exit 1 if the current build regressed against a baseline."""

from __future__ import annotations

import sys

import click

from harness.cli import Selection, cli, selection_options
from harness.commands.diff import growth_options


@cli.command()
@click.option("--baseline", "baseline_path", required=True, type=click.Path(exists=True, dir_okay=False),
              help="Records to compare with: the output of `run --format json`, or a store .jsonl file.")
@click.option("--store", "store_dir", type=click.Path(file_okay=False), default=None,
              help="Read this build's records from this store instead of running the selection.")
@selection_options
@growth_options
@click.option("--junit", type=click.Path(dir_okay=False), default=None,
              help="Write JUnit XML here: one testcase per (case, impl), failing on a regression.")
def gate(baseline_path, store_dir, impls, case_patterns, exhaustive, device, backend, world_sizes, timeout,
         growth, growth_floor, junit):
    """Compare the current build with a baseline; exit 1 on any regression, 0 otherwise.

    A regression is a baseline pass that is anything else now, or error growth beyond --growth. With --store,
    the current records are this build's records in the store (--impl and --case filter them, --device and
    --backend pick the build); otherwise the selection runs now.
    """
    from harness import gate as gate_mod
    from harness.builddiff import GrowthRule
    from harness.output import write_junit_rows

    baseline = gate_mod.load_baseline(baseline_path)
    sel = Selection(impls, case_patterns if not store_dir else (), exhaustive, device, backend, world_sizes,
                    timeout)
    if store_dir:
        current = gate_mod.stored_current(store_dir, current_key(sel), impls, case_patterns)
    else:
        current = run_current(sel)
    result = gate_mod.evaluate(baseline, current, GrowthRule(growth, growth_floor))
    click.echo(gate_mod.format_result(result, baseline_path))
    if junit:
        write_junit_rows(gate_mod.junit_rows(result), junit, suite_name="syncbn-harness gate")
    sys.exit(result.exit_code)


def current_key(sel: Selection) -> str:
    """The store key of the build under test with the selection's device and backend."""
    from harness.buildinfo import build_info
    from harness.store import build_key

    info = build_info()
    return build_key(info.torch_version, info.torch_git_version, sel.options.device, sel.options.resolved_backend)


def run_current(sel: Selection):
    """Run the selection now (not stored), with progress on a terminal."""
    from harness.progress import Progress, wanted
    from harness.runner import run_selection

    impl_objs = sel.impls()
    if not sel.cases:
        from harness.errors import UsageError

        raise UsageError("the selection is empty: no case matches (see `syncbn-harness list cases`)")
    out = []
    with Progress(len(sel.cases) * len(impl_objs), enabled=wanted(sys.stderr)) as bar:
        for record in run_selection(sel.cases, impl_objs, sel.options):
            bar.update(record)
            out.append(record)
    return out
