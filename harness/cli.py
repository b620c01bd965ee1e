"""The command line (SPEC §11). Flags are parsed here; the work is done by plain functions.

Every command catches :class:`HarnessError` once (in :func:`main`) and turns it
into a message on stderr and the error's exit code; ``check`` maps every
failure to the ``git bisect run`` codes instead (0, 1, 125, never >= 128).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Optional

import click

from harness import __version__
from harness.errors import HarnessError, UsageError

EXIT_USAGE = 2
EXIT_HARNESS = 3
EXIT_UNTESTABLE = 125


def selection_options(fn):
    """The selection flags shared by every command that runs cases."""
    opts = [
        click.option("--impl", "impls", multiple=True, metavar="NAME",
                     help="reference, torch, apex, a registered plugin, or MODULE:ATTR (repeatable)."),
        click.option("--case", "case_patterns", multiple=True, metavar="GLOB",
                     help="Shell-style pattern over case IDs (repeatable). Default: the default selection."),
        click.option("--exhaustive", is_flag=True, help="The full generated product instead of the default selection."),
        click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None,
                     help="Default: cuda if available, else cpu."),
        click.option("--backend", type=click.Choice(["gloo", "nccl"]), default=None, help="Default: by device."),
        click.option("--world-size", "world_sizes", type=click.IntRange(min=1), multiple=True,
                     help="Only cases of this world size (repeatable)."),
        click.option("--timeout", type=click.FloatRange(min=0.1), default=None,
                     help="Seconds per case before it is a hang (default 120)."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


class Selection:
    """The parsed selection flags, resolved into cases, implementations and run options."""

    def __init__(self, impls, case_patterns, exhaustive, device, backend, world_sizes, timeout):
        from harness import catalog, runner

        self.device = device or _default_device()
        if self.device == "cpu" and backend == "nccl":
            raise UsageError("--backend nccl needs --device cuda: on CPU use --backend gloo")
        self.cases = catalog.select(case_patterns, exhaustive=exhaustive, world_sizes=world_sizes)
        self.impl_names = list(impls) or runner.default_impls()
        self.options = runner.RunOptions(device=self.device, backend=backend,
                                         timeout=timeout or runner.DEFAULT_TIMEOUT_S)

    def impls(self):
        from harness import runner

        return runner.resolve_impls(self.impl_names)


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="syncbn-harness")
def cli():
    """Regression and bisection harness for SyncBatchNorm implementations."""


@cli.command()
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
def env(fmt):
    """The build under test: torch, CUDA, backends, kernel build state, apex state."""
    from harness.envreport import environment

    data = environment()
    if fmt == "json":
        click.echo(json.dumps(data, indent=2))
        return
    width = max(len(k) for k in data)
    for key, value in data.items():
        if isinstance(value, (list, tuple)):
            value = ", ".join(map(str, value)) or "none"
        click.echo(f"{key:<{width}}  {value if value is not None else 'none'}")


@cli.command("list")
@click.argument("what", type=click.Choice(["cases", "impls"]))
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
@click.option("--exhaustive", is_flag=True, help="List the full product, not only the default selection.")
def list_cmd(what, fmt, exhaustive):
    """What can be selected: cases (id, family, params) or implementations (state, version, support)."""
    from harness import catalog, impls

    if what == "cases":
        cases = catalog.select(exhaustive=exhaustive)
        rows = [{"id": c.id, "family": c.family, "default": c.default, "params": c.params()} for c in cases]
        if fmt == "json":
            click.echo(json.dumps(rows, indent=2))
        else:
            for c in cases:
                p = c.params()
                click.echo(f"{c.id:<60} ws={c.world_size} {p['dtype']}/{p['param_dtype']} {p['memory_format']} "
                           f"batches={p['batch_sizes']}")
            click.echo(f"{len(cases)} cases", err=True)
        return
    rows = [impls.resolve(name).describe() for name in impls.known_names()]
    if fmt == "json":
        click.echo(json.dumps(rows, indent=2))
    else:
        for r in rows:
            state = r["state"] + (f" ({r['reason']})" if r["reason"] else "")
            click.echo(f"{r['name']:<12} {r['version'] or '-':<14} {r['mode'] or '-':<14} {state}")


@cli.command("build-kernels")
@click.option("--cuda/--no-cuda", default=None, help="Include the CUDA sources (default: when a GPU is present).")
@click.option("--cuda-arch", default=None, metavar="LIST",
              help='CUDA architectures, e.g. "8.0;9.0" (default: this GPU, or 8.0;9.0 with none).')
@click.option("--verbose", is_flag=True, help="Show the compiler's output.")
def build_kernels(cuda, cuda_arch, verbose):
    """Prebuild the reference extension for this torch build (cached per build and source)."""
    import time

    from harness import extension

    spec = extension.default_spec(cuda=cuda, cuda_archs=cuda_arch)
    t0 = time.perf_counter()
    path = extension.build(spec, verbose=verbose)
    what = f"CPU + CUDA ({spec.cuda_archs or 'this GPU'})" if spec.with_cuda else "CPU"
    click.echo(f"built {what} kernels in {time.perf_counter() - t0:.1f}s: {path}")


@cli.command()
@selection_options
@click.option("--store", "store_dir", type=click.Path(file_okay=False), default=None,
              help="Results store directory (default: $SYNCBN_HARNESS_STORE or ./results).")
@click.option("--resume", is_flag=True, help="Skip what the store already holds for this build and selection.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
@click.option("--junit", type=click.Path(dir_okay=False), default=None, help="Also write JUnit XML here.")
def run(impls, case_patterns, exhaustive, device, backend, world_sizes, timeout, store_dir, resume, fmt, junit):
    """Run the selected cases, store and print the records. Exit 1 on any unexpected failure."""
    from harness import records as rec
    from harness.output import print_table, write_junit
    from harness.runner import execute_run

    sel = Selection(impls, case_patterns, exhaustive, device, backend, world_sizes, timeout)

    def progress(record):
        if fmt == "table":
            click.echo(f"{record.status.value:<11} {record.case}  [{record.impl}]"
                       + (f"  {record.message}" if record.message and record.status != rec.Status.PASS else ""),
                       err=True)

    out, is_writer = execute_run(sel.cases, sel.impls(), sel.options, store_dir=store_dir or default_store(),
                                 resume=resume, on_record=progress)
    if not is_writer:
        sys.exit(0)  # a torchrun rank other than 0: rank 0 reports
    if fmt == "json":
        click.echo(json.dumps([r.to_dict() for r in out], indent=2))
    else:
        print_table(out)
    if junit:
        write_junit(out, junit)
    sys.exit(rec.exit_code(out))


def default_store() -> str:
    return os.environ.get("SYNCBN_HARNESS_STORE") or "results"


@cli.command()
@selection_options
def check(impls, case_patterns, exhaustive, device, backend, world_sizes, timeout):
    """For `git bisect run`: exit 0 good, 1 bad, 125 cannot test (never 128 or more)."""
    sys.exit(check_exit_code(impls, case_patterns, exhaustive, device, backend, world_sizes, timeout))


def check_exit_code(impls, case_patterns, exhaustive, device, backend, world_sizes, timeout) -> int:
    """The verdict of ``check`` as an exit code; every failure of the harness itself is 125."""
    try:
        from harness import records as rec
        from harness import runner

        sel = Selection(impls, case_patterns, exhaustive, device, backend, world_sizes, timeout)
        impl_objs = sel.impls()
        if not sel.cases:
            click.echo("check: nothing selected; cannot test", err=True)
            return EXIT_UNTESTABLE
        out = list(runner.run_selection(sel.cases, impl_objs, sel.options))
        runnable = [r for r in out if r.status not in (rec.Status.SKIPPED, rec.Status.UNSUPPORTED)]
        if not runnable:
            click.echo("check: every selected (case, impl) was skipped or unsupported; cannot test", err=True)
            return EXIT_UNTESTABLE
        bad = [r for r in out if r.failed]
        for r in bad:
            click.echo(f"check: {r.status.value} {r.case} [{r.impl}] {r.message}", err=True)
        click.echo(f"check: {len(runnable) - len(bad)} good, {len(bad)} bad", err=True)
        return 1 if bad else 0
    except HarnessError as exc:
        click.echo(f"check: cannot test: {exc}", err=True)
        return EXIT_UNTESTABLE
    except Exception as exc:  # noqa: BLE001 - a harness failure must never abort a bisect (exit >= 128)
        import traceback

        traceback.print_exc()
        click.echo(f"check: harness failure ({type(exc).__name__}: {exc}); cannot test", err=True)
        return EXIT_UNTESTABLE


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


def _terminate_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so every pool's `finally` reaps its ranks."""

    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    if hasattr(signal, "SIGTERM"):
        signal.signal(signal.SIGTERM, handler)


def main(argv: Optional[list] = None) -> None:
    """Entry point of the console script and of ``python -m harness``."""
    _terminate_on_sigterm()
    try:
        cli.main(args=argv, prog_name="syncbn-harness", standalone_mode=False)
    except click.exceptions.UsageError as exc:
        exc.show()
        sys.exit(EXIT_USAGE)
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except HarnessError as exc:
        click.echo(f"syncbn-harness: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted; every rank process was stopped", err=True)
        sys.exit(130)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except SystemExit:
        raise


if __name__ == "__main__":  # pragma: no cover
    main()
