"""``syncbn-harness gpu-evidence``: file a GPU run's raw files in the repository; check the pages that cite them."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from harness.commands import cli


@cli.command("gpu-evidence")
@click.argument("packed", required=False, type=click.Path(file_okay=False, exists=True))
@click.option("--into", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="Where the run's files go, a new folder (docs/gpu-runs/<date>-<gpu>).")
@click.option("--call", "calls", multiple=True, metavar="COMMAND",
              help="The exact command of one call to the GPU machine (repeatable, in order): kept in calls.md.")
@click.option("--check", "check_pages", multiple=True, type=click.Path(dir_okay=False, exists=True),
              metavar="PAGE", help="Render every table PAGE cites from the run's files; exit 1 where one differs.")
@click.option("--refresh", "refresh_pages", multiple=True, type=click.Path(dir_okay=False, exists=True),
              metavar="PAGE", help="Rewrite every table PAGE cites from the run's files.")
def gpu_evidence(packed, into, calls, check_pages, refresh_pages):
    """File PACKED (what `gpu-suite --out` left, as the GPU machine sent it back) into --into, with the command of
    each call; or check or refresh the tables a page cites from filed runs (docs/gpu-results.md).

    A table is cited between `<!-- table: RUN_FOLDER SECTION -->` and `<!-- end table -->`; the sections are
    machine, steps, tests, records, fidelity, bench, ncu, nccl and repros.
    """
    from harness.errors import UsageError
    from harness.gpu_suite import evidence

    root = Path.cwd()
    if packed:
        if not into:
            raise UsageError("gpu-evidence PACKED needs --into DIR (a new folder, e.g. docs/gpu-runs/<date>-<gpu>)")
        written = evidence.file_run(Path(packed), Path(into), list(calls))
        click.echo(f"filed {len(written)} files into {into}")
        runs = root / "docs" / "findings" / "runs.toml"
        if runs.is_file() and Path(into).resolve().is_relative_to(root.resolve()):
            # filed into the harness's own repository: the repro verdicts become runs of record
            n = evidence.record_repro_runs(Path(into), runs, root)
            click.echo(f"recorded {n} repro runs in {runs.relative_to(root)}")
    for page in refresh_pages:
        changed = evidence.refresh_page(Path(page), root)
        click.echo(f"{page}: {changed} tables rewritten from their runs' files")
    problems = [p for page in check_pages for p in evidence.check_page(Path(page), root)]
    for problem in problems:
        click.echo(problem, err=True)
    if not (packed or refresh_pages or check_pages):
        raise UsageError("gpu-evidence: give PACKED --into DIR, --check PAGE or --refresh PAGE")
    if problems:
        sys.exit(1)
