"""Judge variants of torch's SyncBatchNorm Python (a change undone, a mutant) by the first case they fail.

A variant is the installed torch with some of SyncBatchNorm's files replaced
(:class:`Variant`). It runs as ``torch@DIR`` (:mod:`harness.impls.torch_patched`):
the same cpu-emulation, device path and known issues as the installed torch,
with the variant's files written into a temporary folder laid out like a
checkout. It is *caught* by the first case whose record differs from the
control's: the installed files in the same canonical form (comments dropped,
one statement per line, :func:`harness.undo.hunks.canonical`) run the same
way, so a difference is the variant's and not the copying's. Records differ
when their status or their failures (:func:`harness.results.symptoms.failures`)
differ (a crash or a hang by status alone: what each rank saw of a dying
collective varies from run to run): a case that fails as a known torch defect still catches a variant
that fails it in another way.

Cases run in this order and stop at the first catch: the variant's own
patterns (``first``), then the cases that caught earlier variants (the most
recent first: a sweep of many similar variants finds its catches early), then
the rest in catalog order. The control's record of a case is made once, when
a variant first needs it. :class:`Sweep` keeps one warm session for the
control and makes one per variant, closed (its ranks reaped) and its folder
removed before the next; Ctrl-C kills every rank.
"""

from __future__ import annotations

import fnmatch
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from harness.errors import ImplUnavailable
from harness.judge.status import Status
from harness.results.symptoms import failures
from harness.selection import RunOptions
from harness.undo import sources
from harness.undo.hunks import canonical


@dataclass(frozen=True)
class Variant:
    """The installed torch with ``files`` (path under the checkout -> text) in place of its own."""

    id: str
    files: dict
    first: tuple[str, ...] = ()


@dataclass(frozen=True)
class Verdict:
    """What one variant did: caught by ``case`` (with its record's status and failures), or not, after ``ran``."""

    variant: str
    case: Optional[str]
    status: str
    symptoms: tuple[str, ...]
    control: str  # the control's status on that case ("" when not caught)
    ran: int
    seconds: float
    reason: str = ""  # the adapter could not load the variant: every case would fail

    @property
    def caught(self) -> bool:
        return self.case is not None or bool(self.reason)


def installed_text(rel: str) -> str:
    """The installed torch's text of ``rel`` (one of :data:`harness.undo.sources.FILES`)."""
    import torch

    return (Path(torch.__file__).parent.parent / rel).read_text()


def _signature(record) -> tuple[str, tuple[str, ...]]:
    """A record's status and failures; a crash or hang by its status alone (which rank saw what of a dying
    collective first varies from run to run)."""
    if record.status in (Status.CRASH, Status.HANG):
        return record.status.value, ()
    return record.status.value, tuple(sorted(failures(record)))


@dataclass
class Sweep:
    """Runs variants against a fixed list of ``cases`` (see the module's note)."""

    cases: list
    opts: RunOptions = field(default_factory=RunOptions)
    killers: list = field(default_factory=list)

    def __post_init__(self):
        self._tmp = Path(tempfile.mkdtemp(prefix="syncbn-sweep-"))
        self._control_dir = self._write("control", {rel: canonical(installed_text(rel)) for rel in sources.FILES})
        self._control = self._open(self._control_dir)
        if self._control[0].unavailable:
            raise RuntimeError(f"the control copy of torch's files does not load: {self._control[0].unavailable}")
        self._baseline: dict[str, tuple[str, tuple[str, ...]]] = {}
        self._made = 0

    def _write(self, name: str, files: dict) -> Path:
        root = self._tmp / name
        for rel, text in files.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        return root

    def _open(self, root: Path):
        from harness.engine.session import Session, resolve_impls

        impls = resolve_impls([f"torch@{root}"])
        return Session(impls, self.opts), impls[0]

    def baseline(self, case) -> tuple[str, tuple[str, ...]]:
        """The control's status and failures on ``case`` (run once)."""
        if case.id not in self._baseline:
            session, impl = self._control
            self._baseline[case.id] = _signature(session.run_one(case, impl))
        return self._baseline[case.id]

    def order(self, first: tuple[str, ...]) -> list:
        """The cases in the order a variant runs them (see the module's note)."""
        rank = {cid: i for i, cid in enumerate(self.killers)}

        def key(item):
            i, case = item
            own = any(fnmatch.fnmatchcase(case.id, p) for p in first)
            return (0 if own else 1 if case.id in rank else 2, rank.get(case.id, 0), i)

        return [c for _, c in sorted(enumerate(self.cases), key=key)]

    def judge(self, variant: Variant) -> Verdict:
        """Run ``variant`` case by case until a record differs from the control's."""
        t0 = time.perf_counter()
        self._made += 1
        root = self._write(f"v{self._made}", variant.files)
        try:
            session, impl = self._open(root)
        except ImplUnavailable as exc:  # the copy does not load: every case would fail
            shutil.rmtree(root, ignore_errors=True)
            return Verdict(variant.id, None, Status.UNSUPPORTED.value, (), "", 0, time.perf_counter() - t0,
                           reason=str(exc))
        try:
            if session.unavailable:
                reason = "; ".join(session.unavailable.values())
                return Verdict(variant.id, None, Status.UNSUPPORTED.value, (), "", 0,
                               time.perf_counter() - t0, reason=reason)
            ran = 0
            for case in self.order(variant.first):
                ran += 1
                status, symptoms = _signature(session.run_one(case, impl))
                control = self.baseline(case)
                if (status, symptoms) != control:
                    if case.id in self.killers:
                        self.killers.remove(case.id)
                    self.killers.insert(0, case.id)
                    return Verdict(variant.id, case.id, status, symptoms, control[0], ran,
                                   time.perf_counter() - t0)
            return Verdict(variant.id, None, "", (), "", ran, time.perf_counter() - t0)
        except BaseException:
            session.close(kill=True)
            raise
        finally:
            session.close()
            shutil.rmtree(root, ignore_errors=True)

    def close(self, *, kill: bool = False) -> None:
        """Stop the control's ranks and remove every folder of the sweep."""
        self._control[0].close(kill=kill)
        shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close(kill=exc_type is not None)
