"""Emulation fidelity: an implementation's records made in cpu-emulation set against its records on CUDA.

On a machine without a GPU, torch's SyncBatchNorm runs its own Python over CPU
stand-ins for its five CUDA kernels (``mode == "cpu-emulation"``). Whether a
verdict made that way holds on CUDA is a question of evidence: run the same
cases on a GPU (``mode == "native"``, ``device == "cuda"``) and compare case by
case. :func:`compare` pairs the latest record of each case on each side and
keeps every case where they disagree:

- the status differs (a pass on one side, an error on the other), or
- the statuses agree but the structural problems do not: a wrong dtype,
  layout or shape flagged on one side only (numbers within tolerance on both
  sides are agreement; their size differs between any two devices).

Cases present on one side only are counted, not compared, and so are cases
of a CPU-only backend (``nccl-contract``: NCCL's collective contract over gloo,
a CPU stand-in that CUDA runs are refused by construction; their CUDA
counterpart is ``--backend nccl`` with a GPU per rank). Each disagreement
is either an emulation defect (the stand-ins are wrong; fix them) or a
difference to explain (the case is not the same on CUDA, e.g. a hang
attributed differently); :func:`to_markdown` leaves a column for that.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from harness.results.records import Record
from harness.results.store import latest

CPU_ONLY_BACKEND = "nccl-contract"
STRUCTURAL = ("dtype", "layout", "memory format", "shape", "stride")


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
    cpu_only: list[str] = field(default_factory=list)  # cases of a CPU-only backend: nothing to compare on CUDA

    @property
    def compared(self) -> int:
        return self.agreed + len(self.disagreements)


def _problems(record: Record) -> tuple[str, ...]:
    """The record's structural problems (metric problems about dtype, layout or shape), sorted and de-ranked."""
    found = set()
    for metric in record.metrics.values():
        problem = metric.problem or ""
        if any(word in problem.lower() for word in STRUCTURAL):
            found.add(problem)
    return tuple(sorted(found))


def _side(record: Record) -> str:
    problems = _problems(record)
    return f"{record.status}" + (f" ({problems[0]})" if problems else "")


def compare(emulated: Iterable[Record], native: Iterable[Record], impl: str = "torch") -> Fidelity:
    """Set ``impl``'s cpu-emulation records against its native CUDA records, case by case (latest of each)."""
    emu = {r.case: r for r in latest(emulated) if r.impl == impl and r.device == "cpu"}
    nat = {r.case: r for r in latest(native) if r.impl == impl and r.device == "cuda"}
    out = Fidelity(impl=impl, only_emulated=sorted(set(emu) - set(nat)), only_native=sorted(set(nat) - set(emu)))
    for case in sorted(set(emu) & set(nat)):
        e, n = emu[case], nat[case]
        if CPU_ONLY_BACKEND in (e.params.get("backend"), n.params.get("backend")):
            out.cpu_only.append(case)
            continue
        if e.status == n.status and _problems(e) == _problems(n):
            out.agreed += 1
        else:
            out.disagreements.append(Disagreement(case, _side(e), _side(n), e.message, n.message))
    return out


def _cell(text: str, width: int = 160) -> str:
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= width else text[:width - 3] + "..."


def to_markdown(fid: Fidelity) -> str:
    """The fidelity table: one row per disagreement, with a column to say whether each is explained or fixed."""
    lines = [f"{fid.impl}: {fid.compared} cases compared, {fid.agreed} agree, {len(fid.disagreements)} disagree"
             f" ({len(fid.only_emulated)} emulated only, {len(fid.only_native)} native only, {len(fid.cpu_only)} of "
             f"the CPU-only {CPU_ONLY_BACKEND} backend not compared)", ""]
    if fid.disagreements:
        lines += ["| case | CPU | CUDA | CPU says | CUDA says |", "| --- | --- | --- | --- | --- |"]
        for d in fid.disagreements:
            lines.append(f"| `{d.case}` | {d.emulated} | {d.native} | {_cell(d.emulated_message)} | "
                         f"{_cell(d.native_message)} |")
    return "\n".join(lines) + "\n"
