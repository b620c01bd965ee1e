"""``syncbn-harness search``: explore the case space, shrink and group failures, optionally promote them."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import click

from harness.commands import cli
from harness.commands._options import default_store, selection_options, store_option
from harness.search.systems import DEFAULT_SYSTEMS, SYSTEMS

# What --system takes: the layer cases, every training system but join (all), or one system by name.
SYSTEM_CHOICES = ("layer", "all") + SYSTEMS
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h)?\s*$")


def parse_duration(value: str) -> float:
    """``90``, ``90s``, ``10m``, ``1.5h`` -> seconds; anything else is a usage error naming the value."""
    from harness.errors import UsageError

    m = _DURATION.match(value or "")
    if not m or float(m.group(1)) <= 0:
        raise UsageError(f"--budget {value!r}: give a positive duration such as 300, 90s, 10m or 1h")
    return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2) or "s"]


def drawn_systems(names) -> tuple[str, ...]:
    """What ``--system`` names (already among :data:`SYSTEM_CHOICES`) draw, in order, each once; none: layer."""
    drawn: list[str] = []
    for name in names or ("layer",):
        drawn += list(DEFAULT_SYSTEMS) if name == "all" else [name]
    return tuple(dict.fromkeys(drawn))


@cli.command()
@selection_options
@store_option()
@click.option("--system", "systems", multiple=True, type=click.Choice(SYSTEM_CHOICES),
              help="What to draw (repeatable): layer (the layer cases, the default), a training system by name, "
                   "or all (every training system but join, whose expected failure is a 15 s hang).")
@click.option("--budget", default=None, metavar="DURATION",
              help="How long to explore: 300, 90s, 10m, 1h (default 5m unless --max-cases is given).")
@click.option("--max-cases", type=click.IntRange(min=1), default=None, help="Explore at most this many cases.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="The same seed, build and implementations draw the same cases.")
@click.option("--save", is_flag=True, help="Promote each new finding's minimal case into the catalog (the search "
              "family, in the default selection from then on).")
@click.option("--out", type=click.Path(file_okay=False), default="reports/search", show_default=True,
              help="Where the findings summary (findings.md, findings.json) and repro files go.")
@click.option("--shrink-limit", default=None, metavar="DURATION",
              help="Most time spent shrinking one finding (default: a quarter of the budget, at least 60s).")
def search(selection, store_dir, systems, budget, max_cases, seed, save, out, shrink_limit):
    """Explore generated cases, shrink each new failure to a minimal case, group findings by signature.

    Cases are drawn by hypothesis over every parameter of the layer families (splits with empty ranks,
    subgroups, dtypes, layouts, step sequences, hostile inputs, sizes up to real networks') and run on warm
    pools. --system draws training systems instead or beside (repeatable): model, ddp, compile, conversion,
    validation, activation-checkpoint, double-backward, autocast, script, join, autocast-grad-scaler, fsdp2;
    all for all of them but join (whose expected failure is a 15 s hang); layer for the layer cases (the
    default). Findings go to the
    store (the original and the minimal case's records) and to --out. Exit 0 when nothing new was found (known
    issues do not count), 1 on a new finding, 2 on a usage error, 3 when the harness could not work.
    """
    from harness.errors import UsageError

    if selection.case_patterns or selection.exhaustive or selection.scenarios:
        raise UsageError("search draws its own cases: --case, --exhaustive and --scenario do not apply (run selects "
                         "catalog cases; search --system says what search draws; search --save promotes what it "
                         "finds into the catalog)")
    budget_s = parse_duration(budget) if budget else (None if max_cases else 300.0)
    shrink_s = parse_duration(shrink_limit) if shrink_limit else None
    result, summary = run_search(selection, store_dir=store_dir or default_store(), budget_s=budget_s,
                                 max_cases=max_cases, seed=seed, save=save, out=Path(out), shrink_limit_s=shrink_s,
                                 command="syncbn-harness " + shlex.join(sys.argv[1:]),
                                 systems=drawn_systems(systems))
    click.echo(summary)
    sys.exit(1 if result.new else 0)


def run_search(selection, *, store_dir, budget_s, max_cases, seed, save, out: Path, shrink_limit_s, command,
               systems: tuple = ("layer",)):
    """The search behind the command: explore, write records, summary and repro files, promote; return them."""
    from harness.engine import launcher

    # Before torch is imported here (the plan's build information imports it): the forkserver then imports torch
    # at the same time as this process instead of after it. Only the compile system needs dynamo.
    chosen = launcher.choose()
    chosen.prewarm("compile" in systems)
    from harness.engine.plan import make_plan
    from harness.results.progress import wanted
    from harness.search.explore import Explorer
    from harness.search.findings import assess_finding, order_by_severity, symptoms_text, write_repros, write_summary

    # The plan decides the adapters, options, build and store key, and refuses a store that cannot take them;
    # search draws its own cases, so the plan holds none.
    plan = make_plan(selection, store_dir=store_dir, diagnose=False, cases=[], launcher=chosen)
    session = plan.launcher.session(plan)  # torchrun refuses: search starts its own ranks
    opts, info, key = plan.opts, plan.info, plan.key
    store = plan.store()
    live = wanted(sys.stderr)
    # nccl-contract carries CPU and CUDA tensors over gloo: beside a gloo run, on either device.
    backends = (None, "nccl-contract") if opts.resolved_backend == "gloo" else (None,)

    def on_case(explorer) -> None:
        r = explorer.result
        if live or r.cases_explored % 50 == 0:
            line = (f"search: {r.cases_explored} cases, {r.runs} runs, {len(r.new)} new / "
                    f"{len(r.findings) - len(r.new)} known findings, {explorer.elapsed():.0f}s")
            click.echo(("\r" + line) if live else line, err=True, nl=not live)

    def on_finding(f, into) -> None:
        store.append(f.original_record)
        if f.minimal.id != f.original.id:
            store.append(f.record)
        if into is not None:
            click.echo(("\n" if live else "") + f"the same cause, shrunk another way: {f.signature}\n  minimal: "
                       f"{f.minimal.id}\n  folded into: {into.title}", err=True)
            return
        kind = "known" if f.known else f"new, shrunk in {f.shrink_runs} runs"
        click.echo(("\n" if live else "") + f"finding ({kind}): {f.title if not f.known else f.signature}\n"
                   f"  minimal: {f.minimal.id}", err=True)

    try:
        explorer = Explorer(session, seed=seed, budget_s=budget_s, max_cases=max_cases,
                            shrink_limit_s=shrink_limit_s, backends=backends,
                            world_sizes=selection.world_sizes or None, systems=systems, on_case=on_case,
                            on_finding=on_finding)
        if opts.device == "cpu" and "layer" in systems:
            # Every pool a layer case may need starts now, while hypothesis draws the first cases (on CPU only,
            # where gloo takes any world size on one machine).
            session.prestart([(ws, b or opts.resolved_backend) for ws in explorer.world_sizes for b in backends])
        result = explorer.run()
    finally:
        session.close(kill=True)
    if live:
        click.echo("", err=True)
    order_by_severity(result)
    write_repros(result, out, opts.device, command)
    md, js = write_summary(result, out, key)
    lines = [f"{result.cases_explored} cases explored in {result.explore_s:.0f}s ({result.rate:.2f} cases/s), "
             f"{result.runs} runs with shrinking; {len(result.new)} new finding(s), "
             f"{len(result.findings) - len(result.new)} known"]
    for f in result.findings:
        tag = "known" if f.known else "NEW"
        a = assess_finding(f)
        lines.append(f"  {tag:<5} {f.signature if f.known else f.title}\n        minimal: {f.minimal.id}"
                     + ("" if f.known else f"\n        symptoms: {symptoms_text(f)}")
                     + (f"\n        severity: {a.summary()}" if a else "")
                     + (f"\n        repro:   {f.repro_file}: {f.repro_verdict}" if f.repro_file else "")
                     + (f"\n        upstream: {f.link}" if f.link else ""))
    lines.append(f"summary: {md} and {js}; records in {store_dir}")
    if save and result.new:
        from harness.search.promote import promote

        path, added = promote(result.new, build=info)
        lines.append(f"promoted {len(added)} case(s) into {path}: `syncbn-harness run --case 'search/*'` selects "
                     "them")
    return result, "\n".join(lines)
