"""``syncbn-harness bench kernels|pool|run|store``: benchmarks with in-run baselines."""

from __future__ import annotations

import json

import click

from harness.commands import cli

# The figures of `bench run` (harness.bench.commands.FIGURES), named here so that --help needs no import.
FIGURE_NAMES = ("startup", "check-one", "run-one", "layer", "ddp", "compile", "default", "impls-1", "impls-3",
                "impls-10", "search", "search-fail")


@cli.group()
def bench():
    """Benchmarks that print ratios against a baseline measured in the same run."""


@bench.command("kernels")
@click.option("--repeat", type=click.IntRange(min=1), default=None,
              help="Timed repetitions per figure (median; default 7 on cpu, 20 on cuda).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="cpu: the CPU ops against torch's CPU batch_norm and a copy; cuda: the CUDA ops against torch's "
                   "native CUDA kernels of the same ops, and the statistics pass against the GPU's bandwidth.")
def bench_kernels_cmd(repeat, fmt, device):
    """The reference kernels against torch's kernels and the memory bandwidth, on CPU or on the GPU."""
    echo = (lambda *a, **k: None) if fmt == "json" else click.echo
    if device == "cuda":
        require_gpu()
        from harness.bench.device_kernels import bench_device_kernels

        figures = bench_device_kernels("cuda", repeat=repeat or 20, echo=echo)
    else:
        from harness.bench.kernels import bench_kernels

        figures = bench_kernels(repeat=repeat or 7, echo=echo)
    if fmt == "json":
        click.echo(json.dumps(figures, indent=2))


@bench.command("pool")
@click.option("--cases", type=click.IntRange(min=1), default=300, help="Cases run through the warm pool.")
@click.option("--fresh-cases", type=click.IntRange(min=1), default=5, help="Cases run with a fresh process group each.")
def bench_pool_cmd(cases, fresh_cases):
    """Warm pool against a fresh process group per case, at world size 2."""
    from harness.bench.pool import bench_pool

    bench_pool(cases=cases, fresh_cases=fresh_cases, echo=click.echo)


def require_gpu() -> None:
    """A usage error (exit 2) naming the fix when torch sees no GPU here."""
    import torch

    from harness.errors import UsageError

    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise UsageError(f"--device cuda: torch {torch.__version__} ({build}) sees no CUDA device here; run it on a "
                         "machine with a GPU and a CUDA build of torch (`syncbn-harness gpu-suite` does), or use "
                         "--device cpu")


@bench.command("run")
@click.option("--baseline", metavar="REF", default=None,
              help="A commit of this checkout to measure in the same sitting (each figure is then a ratio: this "
                   "tree's time over the baseline's).")
@click.option("--figure", "figures", multiple=True, type=click.Choice(FIGURE_NAMES), metavar="NAME",
              help=f"Only this figure (repeatable): {', '.join(FIGURE_NAMES)}. Default: all.")
@click.option("--repeat", type=click.IntRange(min=1), default=3, show_default=True,
              help="Timed runs per figure and tree (the median is reported).")
@click.option("--no-warmup", is_flag=True, help="Skip the untimed first run of each figure in each tree.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
def bench_run_cmd(baseline, figures, repeat, no_warmup, fmt):
    """Whole commands (start-up, one case, the layer/ddp/compile/default selections, 1-3-10 implementations, a
    search) of this tree, against a baseline commit measured turn by turn in the same sitting."""
    from harness.bench.commands import bench_run

    echo = (lambda *a, **k: click.echo(*a, err=True, **k)) if fmt == "json" else click.echo
    rows = bench_run(baseline, tuple(figures) or FIGURE_NAMES, repeat, not no_warmup, echo=echo)
    if fmt == "json":
        click.echo(json.dumps(rows, indent=2))


@bench.command("store")
@click.option("--records", "sizes", default="10000,100000,1000000", show_default=True, metavar="N[,N...]",
              help="Store sizes, in records.")
@click.option("--builds", type=click.IntRange(min=2), default=100, show_default=True,
              help="Builds the records are spread over.")
@click.option("--from", "source", type=click.Path(file_okay=False, exists=True), default=None, metavar="STORE",
              help="Take the template records from this store (default: a small real run made now).")
@click.option("--baseline", metavar="REF", default=None,
              help="A commit of this checkout whose commands run on the same stores, for the ratios.")
@click.option("--baseline-max", type=click.IntRange(min=1), default=100000, show_default=True,
              help="The largest store the baseline runs on.")
@click.option("--keep", type=click.Path(file_okay=False, exists=True), default=None, metavar="DIR",
              help="Make the stores under DIR and keep them (default: a temporary folder, removed).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
def bench_store_cmd(sizes, builds, source, baseline, baseline_max, keep, fmt):
    """report (first indexing, then over the index) and diff over synthetic stores of real records: wall time and
    peak resident memory per command, against a baseline commit on the same stores."""
    from harness.bench.store import bench_store
    from harness.errors import UsageError

    try:
        counts = tuple(int(s) for s in sizes.split(",") if s.strip())
    except ValueError:
        raise UsageError(f"--records {sizes!r}: give record counts separated by commas, e.g. 10000,100000") from None
    echo = (lambda *a, **k: click.echo(*a, err=True, **k)) if fmt == "json" else click.echo
    rows = bench_store(counts, builds, source, baseline, baseline_max, keep, echo=echo)
    if fmt == "json":
        click.echo(json.dumps(rows, indent=2))
