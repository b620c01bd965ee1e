"""``syncbn-harness undo``: torch's SyncBatchNorm with an upstream change undone, or mutated, until a case fails.

``undo fixes`` undoes each change of ``syncbn_fixes.toml`` on the installed
build and runs it; ``undo mutants`` runs every mutant of the same code;
``undo page`` writes ``docs/torch-fixes.md`` from their results files.
Exit 1 when what ran leaves something unexplained (see
:func:`harness.undo.page.problems`).
"""

from __future__ import annotations

import fnmatch
import random
import sys
from pathlib import Path

import click

from harness.commands import cli
from harness.errors import UsageError

DOCS = Path("docs/torch-fixes")


def _cases(patterns, exhaustive: bool, extra=()):
    from harness import catalog

    chosen = catalog.select(list(patterns), exhaustive=exhaustive)
    ids = {c.id for c in chosen}
    for pattern in extra:  # a change's own cases, wherever they sit in the product
        chosen += [c for c in catalog.select([pattern], exhaustive=True) if c.id not in ids]
        ids = {c.id for c in chosen}
    return chosen


def _sweep_options(fn):
    fn = click.option("--out", type=click.Path(dir_okay=False), default=None,
                      help="Merge the results into this JSON file (rows run replace theirs).")(fn)
    fn = click.option("--timeout", type=click.FloatRange(min=1), default=60.0, show_default=True,
                      help="Seconds per case before it is a hang.")(fn)
    fn = click.option("--exhaustive", is_flag=True, help="Run the full product's cases, not the default "
                                                         "selection's.")(fn)
    fn = click.option("--case", "patterns", multiple=True, metavar="GLOB",
                      help="Only these cases (repeatable; default: the default selection).")(fn)
    return fn


@cli.group()
def undo():
    """Undo torch's own SyncBatchNorm fixes (or mutate its code) on the installed build, and say which case
    catches each."""


@undo.command("fixes")
@click.option("--fix", "only", multiple=True, metavar="ID",
              help="Only these changes (repeatable): an ID the dry run prints (pr98332, pr14267-2, 2.5.0-1), or a "
                   "pull request's number (all of its entries).")
@click.option("--sources", type=click.Path(file_okay=False, exists=True), default=None,
              help="Read each release's files from here (<release>/torch/nn/modules/...) instead of its wheel.")
@click.option("--fixes-file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="The changes (default: cases/syncbn_fixes.toml).")
@click.option("--dry-run", is_flag=True, help="Say how each change would be undone (or why it cannot be) and stop.")
@click.option("--diff", "show_diff", is_flag=True, help="With --dry-run: print each undone file's diff against the "
                                                       "installed file (both in canonical form).")
@_sweep_options
def fixes_command(only, sources, fixes_file, dry_run, show_diff, patterns, exhaustive, timeout, out):
    """Undo each upstream change to SyncBatchNorm's Python, alone, and run the cases until one fails."""
    from harness.engine import forkserver
    from harness.selection import RunOptions
    from harness.undo import fixes as fixes_mod
    from harness.undo import outcomes
    from harness.undo.page import problems
    from harness.undo.sweep import Sweep, Variant, installed_text

    forkserver.prewarm(dynamo=False)
    chosen = fixes_mod.load(fixes_file)
    wanted = {f"pr{o}" if o.isdigit() else o for o in only}
    unknown = {w for w in wanted if not any(f.id == w or f.id.startswith(w + "-") for f in chosen)}
    if unknown:
        raise UsageError(f"--fix {', '.join(sorted(unknown))}: no such change; the changes are "
                         f"{', '.join(f.id for f in chosen)}")
    run = [f for f in chosen if not wanted or any(f.id == w or f.id.startswith(w + "-") for w in wanted)]
    if dry_run:
        for fix in run:
            text, how = fixes_mod.undone(fix, installed_text(fix.file), Path(sources) if sources else None)
            click.echo(f"{fix.id:<10} {fix.kind:<8} " + (f"undone by {how} ({text.hunks} hunks)" if text.ok else
                                                         f"not undone: {text.reason}"))
            if show_diff and text.ok:
                import difflib

                from harness.undo.hunks import canonical

                click.echo("".join(difflib.unified_diff(canonical(installed_text(fix.file)).splitlines(True),
                                                        text.text.splitlines(True), "installed", fix.id, n=1)))
        return
    cases = _cases(patterns, exhaustive, [p for f in run for p in f.cases])
    run_header = outcomes.header(_describe(patterns, exhaustive), patterns, exhaustive) if out else {}
    rows = {}
    with Sweep(cases, RunOptions(timeout=timeout)) as sweep:
        for fix in run:
            text, how = fixes_mod.undone(fix, installed_text(fix.file), Path(sources) if sources else None)
            if not text.ok:
                rows[fix.id] = outcomes.row(None, undo_error=text.reason)
                if out:
                    outcomes.merge(Path(out), {fix.id: rows[fix.id]}, run_header, {f.id for f in chosen})
                click.echo(f"{fix.id:<10} not undone: {text.reason}")
                continue
            verdict = sweep.judge(Variant(fix.id, {fix.file: text.text}, fix.cases))
            rows[fix.id] = outcomes.row(verdict, undone_by=how, hunks=text.hunks)
            if out:  # row by row: an interrupted sweep keeps what it judged
                outcomes.merge(Path(out), {fix.id: rows[fix.id]}, run_header, {f.id for f in chosen})
            said = (f"{verdict.case} ({verdict.control} -> {verdict.status})" if verdict.case else
                    f"the copy does not load: {verdict.reason}" if verdict.reason else
                    f"NOT CAUGHT after {verdict.ran} cases")
            click.echo(f"{fix.id:<8} {how} {said} {verdict.seconds:.0f}s")
    left = problems(run, rows, {}, {})
    for p in left:
        click.echo(f"unexplained: {p}", err=True)
    sys.exit(1 if left else 0)


@undo.command("mutants")
@click.option("--operator", "operators", multiple=True, metavar="OP",
              help="Only mutants of these operators (repeatable): arith, compare, logic, branch, call, number, "
                   "keyword, group, reduce, statement.")
@click.option("--mutant", "globs", multiple=True, metavar="GLOB", help="Only mutants whose ID matches (repeatable).")
@click.option("--sample", type=click.IntRange(min=1), default=None, help="Run N mutants drawn at random.")
@click.option("--seed", type=int, default=0, show_default=True, help="The --sample draw's seed.")
@_sweep_options
def mutants_command(operators, globs, sample, seed, patterns, exhaustive, timeout, out):
    """Run every mutant of SyncBatchNorm's Python until a case fails; list the survivors."""
    from harness.engine import forkserver
    from harness.selection import RunOptions
    from harness.undo import outcomes, sources
    from harness.undo.mutants import OPERATORS, mutants
    from harness.undo.page import problems, survivors
    from harness.undo.sweep import Sweep, Variant, installed_text

    bad = [o for o in operators if o not in OPERATORS]
    if bad:
        raise UsageError(f"--operator {', '.join(bad)}: not an operator; the operators are {', '.join(OPERATORS)}")
    forkserver.prewarm(dynamo=False)
    every = [m for rel in sources.FILES for m in mutants(rel, installed_text(rel), tuple(operators) or OPERATORS)]
    run = [m for m in every if not globs or any(fnmatch.fnmatchcase(m.id, g) for g in globs)]
    if sample and sample < len(run):
        run = random.Random(seed).sample(run, sample)
    if not run:
        raise UsageError(f"--mutant {', '.join(globs)}: no mutant matches; `syncbn-harness undo mutants --help`")
    explained = survivors()
    run_header = outcomes.header(_describe(patterns, exhaustive), patterns, exhaustive) if out else {}
    keep = {m.id for m in every} if not operators else None
    rows = {}
    with Sweep(_cases(patterns, exhaustive), RunOptions(timeout=timeout)) as sweep:
        for i, m in enumerate(run, 1):
            verdict = sweep.judge(Variant(m.id, {m.rel: m.text}))
            rows[m.id] = outcomes.row(verdict, operator=m.operator)
            if out:  # row by row: an interrupted sweep keeps what it judged
                outcomes.merge(Path(out), {m.id: rows[m.id]}, run_header, keep)
            said = verdict.case or verdict.reason[:60] or f"SURVIVES {verdict.ran} cases"
            click.echo(f"[{i}/{len(run)}] {m.id[:90]}  {said}  [{verdict.seconds:.1f}s]")
    left = problems([], {}, rows, {k: v for k, v in explained.items() if k in rows})
    for p in left:
        click.echo(f"unexplained: {p}", err=True)
    alive = sum(1 for r in rows.values() if not (r.get("case") or r.get("reason")))
    click.echo(f"{len(rows)} mutants: {len(rows) - alive} killed, {alive} survive "
               f"({alive - sum(1 for p in left if 'survives' in p)} explained)")
    sys.exit(1 if left else 0)


@undo.command("page")
@click.option("--results", type=click.Path(file_okay=False), default=str(DOCS), show_default=True,
              help="The folder of fixes.json and mutants.json.")
@click.option("--out", type=click.Path(dir_okay=False), default="docs/torch-fixes.md", show_default=True)
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if the page on disk is not what the results "
                                            "make, or they leave something unexplained.")
def page_command(results, out, check):
    """Write the page of both sweeps from their results files."""
    from harness.undo import fixes as fixes_mod
    from harness.undo import outcomes
    from harness.undo.page import markdown, problems, survivors

    from harness.undo import sources
    from harness.undo.mutants import mutants
    from harness.undo.sweep import installed_text

    fixes, explained = fixes_mod.load(), survivors()
    fix_data, mutant_data = outcomes.load(Path(results) / "fixes.json"), outcomes.load(Path(results) / "mutants.json")
    made = sum(1 for rel in sources.FILES for _ in mutants(rel, installed_text(rel)))
    text = markdown(fixes, fix_data, mutant_data, explained, made)
    left = problems(fixes, fix_data["rows"], mutant_data["rows"], explained)
    if check:
        stale = not Path(out).exists() or Path(out).read_text() != text
        if stale:
            click.echo(f"{out} is not what {results} makes: run `syncbn-harness undo page`", err=True)
        for p in left:
            click.echo(f"unexplained: {p}", err=True)
        sys.exit(1 if stale or left else 0)
    Path(out).write_text(text)
    click.echo(f"wrote {out} ({len(left)} unexplained)")


def _describe(patterns, exhaustive: bool) -> str:
    what = "the full product" if exhaustive else "the default selection"
    return f"{what}{' matching ' + ', '.join(f'`{p}`' for p in patterns) if patterns else ''}"
