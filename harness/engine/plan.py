"""One plan per run: what a command that runs cases will do, decided once, then executed by the launcher it names.

Every command that runs cases builds its run here: ``run``, ``check`` (and
so every step of a bisection, which runs ``check`` per build), ``gate``'s
current build, ``repro``'s observation and ``search``'s session.
Protocol: :func:`make_plan` turns a :class:`~harness.selection.Selection`
(or explicit cases: a repro's one case, none for a search that draws its
own) and the store options into a :class:`Plan`: the adapters (``--compare``'s
second implementation included), the run options, the build under test and
its store key (:func:`store_key`, the one spelling of it), the launcher
(:mod:`harness.engine.launcher`, chosen here unless the command chose it
a moment earlier: warm pools of this process, or this process as one rank of
a torchrun job), and, for ``--resume``, the (case, impl) pairs still to
run (under torchrun, the writing rank's, shared with every rank at the job's
start). It checks the store before any case runs (a store that cannot take
this build's records is refused, exit 3) and reads the build's file once:
the same read gives ``--resume`` what is done and the output what was
stored. :func:`execute` runs a plan with its launcher, appending each
record to the store as it finishes; :meth:`Plan.output` is the whole
selection's records (stored ones first met, in selection order).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from harness.buildinfo import BuildInfo, build_info
from harness.engine import launcher as launchers
from harness.engine.launcher import Launcher
from harness.results.records import Record
from harness.selection import RunOptions, Selection


def store_key(info: BuildInfo, opts: RunOptions) -> str:
    """The store's key for records of this build run with ``opts`` (torch version, commit, device, backend)."""
    from harness.results.store import build_key

    return build_key(info.torch_version, info.torch_git_version, opts.device, opts.resolved_backend, info.overlay)


@dataclass
class Plan:
    """A run, decided: what runs, how, and where its records go."""

    cases: list
    impls: list
    opts: RunOptions
    info: BuildInfo
    key: str
    launcher: Launcher
    store_dir: Optional[str] = None
    resume: bool = False
    # (case id, impl name) pairs to run; None: every pair of the selection.
    pairs: Optional[set[tuple[str, str]]] = None
    # With --resume: the latest stored record of each pair the store already holds.
    stored: dict[tuple[str, str], Record] = field(default_factory=dict)

    @property
    def selected(self) -> int:
        """(case, impl) pairs in the selection."""
        return len(self.cases) * len(self.impls)

    @property
    def to_run(self) -> int:
        """Records this process will produce (the launcher's count: the pending pairs; under torchrun, those of
        the job's world size)."""
        return self.launcher.count(self)

    def store(self):
        """The store this plan's records go to (a :class:`~harness.results.store.Store`; None: not stored)."""
        from harness.results.store import Store

        return Store(self.store_dir) if self.store_dir else None

    def output(self, ran: list[Record]) -> list[Record]:
        """The selection's records, in selection order: those run now, else the stored ones (``--resume``)."""
        if not self.resume:
            return ran
        by_pair = dict(self.stored)
        by_pair.update({(r.case, r.impl): r for r in ran})
        return [by_pair[(c.id, i.name)] for c in self.cases for i in self.impls if (c.id, i.name) in by_pair]


def make_plan(selection: Selection, *, store_dir: Optional[str] = None, resume: bool = False,
              compare: Optional[tuple[str, str]] = None, diagnose: bool = True, cases: Optional[list] = None,
              launcher: Optional[Launcher] = None) -> Plan:
    """The plan of one run of ``selection`` (see the module docstring); refuses a store that cannot take it.

    ``store_dir`` None: the records are not stored (``check``, ``gate``'s current build, ``repro``). ``cases``:
    these cases instead of the selection's. ``launcher``: the one the command chose already (default:
    :func:`harness.engine.launcher.choose`).
    """
    from harness.results.store import Store, Where

    if resume and store_dir is None:
        raise ValueError("resume needs a store")
    impls = selection.resolve_impls(extra=compare or ())
    opts = selection.run_options(compare=compare, diagnose=diagnose)
    info = build_info()
    plan = Plan(cases=selection.cases if cases is None else list(cases), impls=impls, opts=opts, info=info,
                key=store_key(info, opts),
                launcher=launcher or launchers.choose(), store_dir=store_dir, resume=resume)
    # Under torchrun only the writing rank reads the store (before any record is appended); with --resume its
    # pending pairs reach every rank at the job's start (harness.engine.torchrun), so that all run the same cases.
    if store_dir is None or not plan.launcher.reads_store(resume):
        return plan
    with Store(store_dir) as store:
        store.prepare(plan.key)
        if resume:
            wanted = {(c.id, i.name) for c in plan.cases for i in plan.impls}
            plan.stored = {(r.case, r.impl): r for r in store.latest(Where(build=plan.key))
                           if (r.case, r.impl) in wanted}
            plan.pairs = wanted - set(plan.stored)
    return plan


def execute(plan: Plan, on_record: Optional[Callable[[Record], None]] = None,
            on_abort: Optional[Callable[[list[Record]], None]] = None) -> tuple[list[Record], bool]:
    """Run ``plan``: its records, each appended to the store as it finishes, and whether this process writes.

    Locally this process drives warm pools and writes every record. Under
    torchrun it is one rank; only the writing rank gets records (the second
    value says whether this process is it). ``on_abort`` is called with every
    record so far when a torchrun job must end early (a rank stuck in a
    collective); the process then exits 1.
    """
    store = plan.store()

    def emit(rec: Record) -> None:
        if store is not None:
            store.append(rec)
        if on_record:
            on_record(rec)

    return plan.launcher.run(plan, emit, on_abort or (lambda records: None))
