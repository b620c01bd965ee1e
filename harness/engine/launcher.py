"""Who starts the ranks of a run: warm pools of this process, or a torchrun job this process is one rank of.

Chosen once, by :func:`choose` (from the variables torchrun sets), when a
command makes its plan (:func:`harness.engine.plan.make_plan`) or, for the
commands that start the forkserver before importing torch, a moment earlier
(:func:`harness.commands._options.start_ranks_early`, which hands its choice
to the plan). Everything that depends on the launcher asks it, and nothing
else asks about torchrun:

- :meth:`Launcher.prewarm`: start what ranks are made from, now (local: the
  forkserver, :mod:`harness.engine.forkserver`; torchrun: nothing, its workers
  are the ranks);
- :meth:`Launcher.count`: the records this process will produce for a plan
  (torchrun: those of the cases of the job's world size);
- :meth:`Launcher.reads_store`: whether this process reads the store while
  planning (torchrun: the writing rank alone, for ``--resume``; the other ranks
  learn its pending pairs at the job's start);
- :meth:`Launcher.run`: run a plan, giving each record to ``emit``;
- :meth:`Launcher.session`: a :class:`~harness.engine.session.Session` that
  runs one (case, impl) at a time (``search``); torchrun refuses, with the reason.

``announces`` says whether this process may speak before the run (a line on
what ``--resume`` left to run): every rank of a torchrun job would say it,
each with its own count, so they say nothing.
"""

from __future__ import annotations

import os
from typing import Callable, Mapping, Optional, Protocol

from harness.engine import forkserver
from harness.errors import UsageError
from harness.results.records import Record

# ``plan`` below is a :class:`harness.engine.plan.Plan` (which holds its launcher: not imported here), and a
# session a :class:`harness.engine.session.Session` (imported when one is made: it imports torch).
Emit = Callable[[Record], None]
OnAbort = Callable[[list[Record]], None]


class Launcher(Protocol):
    """How a plan's ranks start and its records come back (see the module docstring)."""

    announces: bool

    def prewarm(self, needs_dynamo: bool) -> None:
        """Start what ranks are made from, now; ``needs_dynamo``: some case builds optimizers or compiles."""

    def count(self, plan) -> int:
        """Records this process will produce for ``plan``."""

    def reads_store(self, resume: bool) -> bool:
        """Whether this process reads the store while planning."""

    def run(self, plan, emit: Emit, on_abort: OnAbort) -> tuple[list[Record], bool]:
        """Run ``plan``: its records (each given to ``emit`` as it finishes) and whether this process writes them."""

    def session(self, plan):
        """Warm pools for running ``plan``'s adapters one (case, impl) at a time."""


class LocalPools:
    """This process drives warm pools of rank processes (:mod:`harness.engine.session`)."""

    announces = True

    def prewarm(self, needs_dynamo: bool) -> None:
        forkserver.prewarm(dynamo=needs_dynamo)

    def count(self, plan) -> int:
        return plan.selected if plan.pairs is None else len(plan.pairs)

    def reads_store(self, resume: bool) -> bool:
        return True

    def run(self, plan, emit: Emit, on_abort: OnAbort) -> tuple[list[Record], bool]:
        from harness.engine.session import run_selection

        self.prewarm(any(forkserver.case_needs_dynamo(c) for c in plan.cases))
        out = []
        for rec in run_selection(plan.cases, plan.impls, plan.opts, plan.info, pairs=plan.pairs):
            emit(rec)
            out.append(rec)
        return out, True

    def session(self, plan):
        from harness.engine.session import Session

        return Session(plan.impls, plan.opts, plan.info)


class TorchrunJob:
    """This process is rank ``rank`` of a torchrun job of ``world`` ranks (:mod:`harness.engine.torchrun`)."""

    announces = False

    def __init__(self, world: int, rank: int):
        self.world, self.rank = world, rank

    def prewarm(self, needs_dynamo: bool) -> None:
        return None  # torchrun's workers are the ranks: no pool, no forkserver

    def count(self, plan) -> int:
        if plan.pairs is not None:
            ids = {c.id for c in plan.cases if c.world_size == self.world}
            return sum(case in ids for case, _ in plan.pairs)
        return sum(c.world_size == self.world for c in plan.cases) * len(plan.impls)

    def reads_store(self, resume: bool) -> bool:
        return resume and self.rank == 0

    def run(self, plan, emit: Emit, on_abort: OnAbort) -> tuple[list[Record], bool]:
        from harness.engine import torchrun

        job = torchrun.Job(plan.cases, plan.impls, plan.opts, plan.info, resume=plan.resume, pairs=plan.pairs)
        return job.run(emit, on_abort), job.is_writer

    def session(self, plan):
        raise UsageError("search starts its own ranks (one warm pool per world size): run it without torchrun")


def under_torchrun(env: Optional[Mapping[str, str]] = None) -> bool:
    """Whether a process with environment ``env`` (default: this one's) was started by torchrun."""
    env = os.environ if env is None else env
    return "TORCHELASTIC_RUN_ID" in env and "RANK" in env and "WORLD_SIZE" in env


def choose(env: Optional[Mapping[str, str]] = None) -> Launcher:
    """The launcher of a process with environment ``env`` (default: this one's)."""
    env = os.environ if env is None else env
    if under_torchrun(env):
        return TorchrunJob(world=int(env["WORLD_SIZE"]), rank=int(env["RANK"]))
    return LocalPools()
