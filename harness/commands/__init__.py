"""The command line: the ``syncbn-harness`` group, one module per subcommand, errors handled once.

Each module here adds one command to :data:`cli`; flags are parsed there (the
shared ones in :mod:`harness.commands._options`) and the work is done by
plain functions elsewhere in the package, which return data.

:func:`dispatch` catches :class:`~harness.errors.HarnessError` once and
turns it into a message on stderr and the error's exit code; anything else is
a bug and keeps its traceback. :func:`main` installs the process's signal
handlers (SIGTERM unwinds like Ctrl-C, SIGUSR1 dumps stacks), then calls it.
Exit codes, for every command: 0 success, 1 a finding (``run``: an
unexpected failure; ``gate``: a regression or a missing result; ``diff
--fail-on-regression``: a regression), 2 a usage error (the message lists the
valid choices), 3 the harness could not work (no rank could start, store not
writable, kernels do not build), 130 interrupted.
``check`` maps all of these to ``git bisect run``'s 0, 1 and 125.
"""

from __future__ import annotations

import importlib
import pkgutil
import signal
import sys
from typing import Optional

import click

from harness import __version__
from harness.errors import EXIT_INTERRUPTED, EXIT_USAGE, HarnessError, Terminated


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="syncbn-harness")
def cli():
    """Regression and bisection harness for SyncBatchNorm implementations."""


def load_commands() -> None:
    """Import every subcommand module (each adds its command to :data:`cli`)."""
    for mod in sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")):
        importlib.import_module(f"{__name__}.{mod}")


def _terminate_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C (:class:`Terminated`), so every pool's cleanup reaps its ranks."""

    def handler(signum, frame):
        raise Terminated(signum)

    signal.signal(signal.SIGTERM, handler)


def _stacks_on_sigusr1() -> None:
    """``kill -USR1 <pid>`` writes every thread's Python stack to stderr (what a harness that seems stuck does)."""
    import faulthandler

    try:
        faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)
    except (AttributeError, ValueError, OSError):  # no SIGUSR1, or no real stderr (an embedding host)
        pass


def _interrupt_on_sigint() -> None:
    """Ctrl-C raises KeyboardInterrupt even when the harness was started with SIGINT ignored (an inherited
    disposition: Python then leaves it ignored), so an interrupt always reaps the ranks and says what is kept."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


def main(argv: Optional[list] = None) -> None:
    """Entry point of the console script and of ``python -m harness`` (through :mod:`harness.__main__`)."""
    _terminate_on_sigterm()
    _interrupt_on_sigint()
    _stacks_on_sigusr1()
    dispatch(argv)


def dispatch(argv: Optional[list] = None) -> None:
    """Run one command line: return on success, raise ``SystemExit`` with any other exit code. This is
    :func:`main` without the process's signal handlers, so that a host process (a test) can run a command in
    itself and keep its own handlers."""
    load_commands()
    try:
        cli.main(args=argv, prog_name="syncbn-harness", standalone_mode=False)
    except click.exceptions.UsageError as exc:
        exc.show()
        sys.exit(EXIT_USAGE)
    except click.exceptions.Abort:  # click's form of Ctrl-C
        click.echo("interrupted; every rank process was stopped", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except HarnessError as exc:
        click.echo(f"syncbn-harness: {exc}", err=True)
        sys.exit(exc.exit_code)
    except (KeyboardInterrupt, Terminated) as exc:
        what = "terminated" if isinstance(exc, Terminated) else "interrupted"
        click.echo(f"{what}; every rank process was stopped", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
