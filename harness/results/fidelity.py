"""Emulation fidelity: an implementation's records made in cpu-emulation set against its records on CUDA.

On a machine without a GPU, torch's SyncBatchNorm runs its own Python over CPU
stand-ins for its five CUDA kernels (``mode == "cpu-emulation"``). Whether a
verdict made that way holds on CUDA is a question of evidence: run the same
cases on a GPU (``mode == "native"``, ``device == "cuda"``) and compare case by
case. :func:`compare` pairs the latest record of each case on each side and
keeps every case where they disagree:

- the status differs (a pass on one side, an error on the other), or
- the statuses agree but the structural problems do not: a wrong dtype,
  layout or shape (:data:`STRUCTURAL`, kinds of
  :class:`~harness.judge.metric.Problem`) flagged on one side only (numbers
  within tolerance on both sides are agreement; their size differs between any
  two devices). A problem is known by its metric's kind, never by its message:
  the messages say the same thing in a device's own words.

Cases present on one side only are counted, not compared. Cases of the
``nccl-contract`` backend (NCCL's collective contract over gloo's transport)
are compared like any other: it carries CUDA tensors as it carries CPU ones.

Both sides must come from one torch build (the same version and git commit):
cpu-emulation runs torch's own Python, and a verdict made with another
release's Python says nothing of this one's kernels. :func:`build_mismatch`
says how two stores differ, and the command refuses them. Each disagreement
is either an emulation defect (the stand-ins are wrong; fix them) or a
difference to explain (the case is not the same on CUDA, e.g. a hang
attributed differently); :func:`to_markdown` leaves a column for that.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from harness.judge.metric import Problem
from harness.results.records import Record
from harness.results.store import latest

STRUCTURAL = frozenset({Problem.DTYPE, Problem.LAYOUT, Problem.SHAPE})


@dataclass(frozen=True)
class Disagreement:
    """One case whose emulated and native records disagree."""

    case: str
    emulated: str  # the status, and the first structural problem if any
    native: str
    emulated_message: str
    native_message: str


@dataclass
class Fidelity:
    """What :func:`compare` found: the disagreements and how many cases were compared."""

    impl: str
    agreed: int = 0
    disagreements: list[Disagreement] = field(default_factory=list)
    only_emulated: list[str] = field(default_factory=list)
    only_native: list[str] = field(default_factory=list)

    @property
    def compared(self) -> int:
        return self.agreed + len(self.disagreements)


def _problems(record: Record) -> frozenset[Problem]:
    """The kinds of structural problem (dtype, layout, shape) the record's metrics have, on any rank or step."""
    return frozenset(m.kind for m in record.metrics.values() if m.kind in STRUCTURAL)


def _side(record: Record) -> str:
    """The status, and the first structural problem's message (in the record's order) if there is one."""
    first = next((m.problem for m in record.metrics.values() if m.kind in STRUCTURAL), None)
    return f"{record.status}" + (f" ({first})" if first else "")


def compare(emulated: Iterable[Record], native: Iterable[Record], impl: str = "torch") -> Fidelity:
    """Set ``impl``'s cpu-emulation records against its native CUDA records, case by case (latest of each)."""
    emu = {r.case: r for r in latest(emulated) if r.impl == impl and r.device == "cpu"}
    nat = {r.case: r for r in latest(native) if r.impl == impl and r.device == "cuda"}
    out = Fidelity(impl=impl, only_emulated=sorted(set(emu) - set(nat)), only_native=sorted(set(nat) - set(emu)))
    for case in sorted(set(emu) & set(nat)):
        e, n = emu[case], nat[case]
        if e.status == n.status and _problems(e) == _problems(n):
            out.agreed += 1
        else:
            out.disagreements.append(Disagreement(case, _side(e), _side(n), e.message, n.message))
    return out


def builds(records: Iterable[Record], impl: str, device: str) -> set[tuple[str, str]]:
    """The torch builds (version without its local suffix, git commit) of ``impl``'s records on ``device``."""
    return {(r.torch_version.split("+")[0], r.torch_git_version or "?") for r in records
            if r.impl == impl and r.device == device}


def build_mismatch(emulated: Iterable[Record], native: Iterable[Record], impl: str) -> str:
    """Why ``impl``'s emulated and native records cannot be compared (different torch builds), or ''."""
    emu, nat = builds(emulated, impl, "cpu"), builds(native, impl, "cuda")
    if emu and nat and emu != nat:
        def names(found):
            return ", ".join(f"{v} (git {g[:12]})" for v, g in sorted(found))

        return (f"{impl}: the cpu-emulation records come from torch {names(emu)} and the CUDA records from torch "
                f"{names(nat)}")
    return ""


def _cell(text: str, width: int = 160) -> str:
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= width else text[:width - 3] + "..."


def to_markdown(fid: Fidelity) -> str:
    """The fidelity table: one row per disagreement, with a column to say whether each is explained or fixed."""
    lines = [f"{fid.impl}: {fid.compared} cases compared, {fid.agreed} agree, {len(fid.disagreements)} disagree"
             f" ({len(fid.only_emulated)} emulated only, {len(fid.only_native)} native only)", ""]
    if fid.disagreements:
        lines += ["| case | CPU | CUDA | CPU says | CUDA says |", "| --- | --- | --- | --- | --- |"]
        for d in fid.disagreements:
            lines.append(f"| `{d.case}` | {d.emulated} | {d.native} | {_cell(d.emulated_message)} | "
                         f"{_cell(d.native_message)} |")
    return "\n".join(lines) + "\n"
