"""``syncbn-harness gate --baseline FILE``: exit 1 if the current build regressed against a baseline."""

from __future__ import annotations

import sys

import click

from harness.commands import cli
from harness.commands._options import growth_options, selection_options, start_ranks_early, store_option


@cli.command()
@click.option("--baseline", "baseline_path", required=True, type=click.Path(exists=True, dir_okay=False),
              help="Records to compare with: the output of `run --format json`, or a store .jsonl file.")
@store_option("Read this build's records from this store instead of running the selection.")
@selection_options
@growth_options
@click.option("--allow-missing", is_flag=True,
              help="Pass even when the current records lack (case, impl) pairs the baseline ran (a deliberate "
                   "subset). Without it, each is a failure of the gate, listed as MISSING.")
@click.option("--fail-on-collectives-change", "fail_on_collectives", is_flag=True,
              help="Also fail when a (case, impl) keeps its status but its ranks issue other collectives than in "
                   "the baseline (count, op, dtype or size). Without it such changes are listed, not failing.")
@click.option("--fail-on-graph-break-change", "fail_on_compilation", is_flag=True,
              help="Also fail when a compiled (case, impl) keeps its status but dynamo compiled it differently "
                   "(graph count, a graph break or eager frame added or gone). Without it such changes are "
                   "listed, not failing.")
@click.option("--junit", type=click.Path(dir_okay=False), default=None,
              help="Write JUnit XML here: one testcase per (case, impl), failing on a regression or a missing "
                   "result.")
def gate(baseline_path, store_dir, selection, growth, growth_floor, allow_missing, fail_on_collectives,
         fail_on_compilation, junit):
    """Compare the current build with a baseline; exit 1 on any regression or missing result, 0 otherwise.

    A regression is a baseline pass that is anything else now, or error growth beyond --growth. A missing result
    is a (case, impl) the baseline ran that the current records lack. With --store, the current records are this
    build's records in the store (--impl and --case filter them, --device and --backend pick the build);
    otherwise the selection runs now.
    """
    launcher = None if store_dir else start_ranks_early(selection)
    from harness.results import gate as gate_mod
    from harness.results import junit as junit_xml
    from harness.results.diff import GrowthRule

    baseline = gate_mod.load_baseline(baseline_path)
    if store_dir:
        current = gate_mod.stored_current(store_dir, current_key(selection), selection.impls,
                                          selection.case_patterns)
        if selection.scenarios:
            from harness import catalog

            ids = {c.id for c in catalog.select(exhaustive=True, scenarios=selection.scenarios)}
            current = [r for r in current if r.case in ids]
    else:
        current = run_current(selection, launcher)
    result = gate_mod.evaluate(baseline, current, GrowthRule(growth, growth_floor), allow_missing=allow_missing,
                               fail_on_collectives=fail_on_collectives, fail_on_compilation=fail_on_compilation)
    click.echo(gate_mod.format_result(result, baseline_path))
    if junit:
        junit_xml.write(gate_mod.junit_rows(result), junit, suite_name="syncbn-harness gate")
    sys.exit(result.exit_code)


def current_key(selection) -> str:
    """The store key of the build under test with the selection's device and backend."""
    from harness.buildinfo import build_info
    from harness.engine.plan import store_key

    return store_key(build_info(), selection.run_options())


def run_current(selection, launcher=None) -> list:
    """Run the selection now (not stored), with progress on a terminal; ``launcher``: the one chosen already."""
    from harness.engine.plan import execute, make_plan
    from harness.results.progress import Progress, wanted

    plan = make_plan(selection, diagnose=False, launcher=launcher)
    with Progress(plan.to_run, enabled=wanted(sys.stderr)) as bar:
        records, is_writer = execute(plan, on_record=bar.update)
    if not is_writer:
        sys.exit(0)  # a torchrun rank other than the writer: the writer gives the verdict
    return records
