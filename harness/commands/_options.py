"""Flags shared by several commands: the selection, the store, the growth rule.

:func:`selection_options` adds ``--impl``, ``--case``, ``--exhaustive``,
``--device``, ``--backend``, ``--world-size``, ``--scenario`` and ``--timeout`` and hands the
command one :class:`~harness.selection.Selection` as its ``selection``
argument, so every command reads them the same way.
"""

from __future__ import annotations

import functools

import click

from harness.paths import default_store  # noqa: F401 - the commands' one spelling
from harness.selection import BACKENDS, DEFAULT_TIMEOUT_S, DEVICES, Selection

CASE_HELP = ("Shell-style pattern over case IDs (repeatable): the default selection's cases that match (the full "
             "product's with --exhaustive); an exact case ID always selects that case. Default: the default "
             "selection.")


def selection_options(fn=None, *, timeout: bool = True):
    """Add the selection flags to a command; it receives ``selection`` (a :class:`Selection`)."""
    if fn is None:
        return functools.partial(selection_options, timeout=timeout)
    opts = [
        click.option("--impl", "impls", multiple=True, metavar="NAME",
                     help="reference, torch, apex, a registered plugin, MODULE:ATTR, or torch@PATH (a patched "
                          "copy of torch's SyncBatchNorm from a checkout, run as torch; repeatable). "
                          "Default: every built-in implementation."),
        click.option("--case", "case_patterns", multiple=True, metavar="GLOB", help=CASE_HELP),
        click.option("--exhaustive", is_flag=True, help="Select from the full generated product, not the default "
                                                        "selection."),
        click.option("--device", type=click.Choice(DEVICES), default=None,
                     help="Default: cuda if torch sees a GPU, else cpu."),
        click.option("--backend", type=click.Choice(BACKENDS), default=None,
                     help="Process-group backend. Default: nccl on cuda, gloo on cpu. nccl-contract (cpu): "
                          "NCCL's collective contract over gloo, so torch takes its non-gloo code path; list-contract "
                          "(cpu): a backend with the list all_gather only, as MPI's."),
        click.option("--world-size", "world_sizes", type=click.IntRange(min=1), multiple=True,
                     help="Only cases of this world size (repeatable)."),
        click.option("--scenario", "scenarios", multiple=True, metavar="NAME",
                     help="Only cases of this scenario (repeatable): layer, model, conversion, checkpoint, "
                          "cuda_graph."),
    ]
    if timeout:
        opts.append(click.option("--timeout", type=click.FloatRange(min=0.1), default=None,
                                 help=f"Seconds per case before it is a hang (default {DEFAULT_TIMEOUT_S:g})."))

    @functools.wraps(fn)
    def wrapper(*args, impls, case_patterns, exhaustive, device, backend, world_sizes, scenarios, timeout=None,
                **kwargs):
        kwargs["selection"] = Selection(impls=impls, case_patterns=case_patterns, exhaustive=exhaustive,
                                        device=device, backend=backend, world_sizes=world_sizes, timeout=timeout,
                                        scenarios=scenarios)
        return fn(*args, **kwargs)

    for opt in reversed(opts):
        wrapper = opt(wrapper)
    return wrapper


def start_ranks_early(selection: Selection):
    """Choose the run's launcher and have it start what ranks are made from now, before this process imports
    torch, so that both import it at once (see :mod:`harness.engine.forkserver`); for the commands that run
    cases, first thing. Returns the launcher, for :func:`harness.engine.plan.make_plan`."""
    from harness.engine import forkserver, launcher

    chosen = launcher.choose()
    chosen.prewarm(forkserver.needs_dynamo(selection.case_patterns))
    return chosen


def store_option(help_text: str = "Results store directory (default: $SYNCBN_HARNESS_STORE or ./results)."):
    return click.option("--store", "store_dir", type=click.Path(file_okay=False), default=None, help=help_text)


def growth_options(fn):
    """``--growth`` and ``--growth-floor``: when a larger worst err/tol counts as error growth."""
    fn = click.option("--growth-floor", type=click.FloatRange(min=0.0), default=0.1, show_default=True,
                      help="Growth is measured from at least this worst err/tol: a case grows only past "
                      "--growth x this.")(fn)
    fn = click.option("--growth", type=click.FloatRange(min=1.0), default=2.0, show_default=True,
                      help="Error growth: the worst err/tol ratio grew by more than this factor.")(fn)
    return fn
