"""The command line (SPEC §11): the group, the shared selection flags, and error handling.

One module per subcommand lives in :mod:`harness.commands` (each adds itself to
:data:`cli`); flags are parsed there and the work is done by plain functions.

Every command catches :class:`HarnessError` once (in :func:`main`) and turns it
into a message on stderr and the error's exit code; ``check`` maps every
failure to the ``git bisect run`` codes instead (0, 1, 125, never >= 128).
"""

from __future__ import annotations

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


def default_store() -> str:
    return os.environ.get("SYNCBN_HARNESS_STORE") or "results"


def _load_commands() -> None:
    """Import every module of :mod:`harness.commands`; each adds its command to :data:`cli`."""
    import importlib
    import pkgutil

    from harness import commands

    for mod in sorted(m.name for m in pkgutil.iter_modules(commands.__path__)):
        importlib.import_module(f"harness.commands.{mod}")


def _terminate_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so every pool's `finally` reaps its ranks."""

    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    if hasattr(signal, "SIGTERM"):
        signal.signal(signal.SIGTERM, handler)


def main(argv: Optional[list] = None) -> None:
    """Entry point of the console script and of ``python -m harness``."""
    _terminate_on_sigterm()
    _load_commands()
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
