"""``syncbn-harness bench kernels|pool``: benchmarks with in-run baselines."""

from __future__ import annotations

import json

import click

from harness.commands import cli


@cli.group()
def bench():
    """Benchmarks that print ratios against a baseline measured in the same run."""


@bench.command("kernels")
@click.option("--repeat", type=click.IntRange(min=1), default=7, help="Timed repetitions per figure (median).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
def bench_kernels_cmd(repeat, fmt):
    """CPU ops and reference fwd+bwd against torch's CPU batch_norm and a plain copy."""
    from harness.bench import bench_kernels

    echo = (lambda *a, **k: None) if fmt == "json" else click.echo
    figures = bench_kernels(repeat=repeat, echo=echo)
    if fmt == "json":
        click.echo(json.dumps(figures, indent=2))


@bench.command("pool")
@click.option("--cases", type=click.IntRange(min=1), default=300, help="Cases run through the warm pool.")
@click.option("--fresh-cases", type=click.IntRange(min=1), default=5, help="Cases run with a fresh process group each.")
def bench_pool_cmd(cases, fresh_cases):
    """Warm pool against a fresh process group per case, at world size 2."""
    from harness.bench import bench_pool

    bench_pool(cases=cases, fresh_cases=fresh_cases, echo=click.echo)
