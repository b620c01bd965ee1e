"""``repro``: a standalone Python file that reproduces one (case, implementation).

Two forms:
- the short form (the default; :mod:`harness.repro.short`, its text in
  :mod:`harness.repro.short_text`): an issue-ready file of about a hundred
  lines that shows the one symptom the harness observed
  (:mod:`harness.repro.symptom`) against ``torch.nn.BatchNorm`` in float64,
  with nothing but torch and the library under test installed. It is run
  once after writing (:func:`harness.repro.short.verify`), so that the
  command says whether the file shows the symptom on its own;
- the long form (``--long``; :mod:`harness.repro.long`, its launcher
  :mod:`harness.repro.standalone`): the harness's own code for the case,
  copied from its source, with the harness's oracle and tolerances. It covers
  what the short form cannot state (model conversion, torch.compile, the
  collectives a rank issued).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from harness.catalog.case import Case
from harness.errors import UsageError
from harness.repro import short
from harness.repro.long import repro_source, resolve_impl
from harness.repro.symptom import NoSymptom, symptom_of

__all__ = ["Written", "find_case", "observe", "repro_source", "seen_line", "write_repro", "write_short"]
FAILING = ("mismatch", "error", "crash", "hang")


# What a short file prints when it judged the symptom present (its exit code alone does not say it).
SHOWN = "SYMPTOM SHOWS"


@dataclass
class Written:
    """A written repro file: its form, the record it reproduces, and what running it alone gave."""

    path: Path
    form: str  # "short" | "long"
    record: object = None  # the harness's record of the case (None with --no-run)
    exit_code: Optional[int] = None  # the file's own exit code when verified (1: it shows the symptom)
    output: str = ""  # the verification run's last lines
    judged: bool = False  # the verification run printed SHOWN: the file itself judged the symptom present

    def verdict(self) -> str:
        """One line on what the file does on its own. Exit 1 counts as the symptom only with the line the file
        prints when it judged one (:data:`SHOWN`): Python also exits 1 on an uncaught error, before any
        judging."""
        if self.exit_code is None:
            return "not run"
        if self.exit_code == 1:
            if self.judged:
                return "shows the symptom standalone (exit 1)"
            return (f"exits 1 without its {SHOWN!r} line: it broke before judging (an uncaught error?): "
                    f"{self.output.strip()[-300:]}")
        if self.exit_code == 0:
            return ("does NOT show it standalone (exit 0): the failure stays within the short form's "
                    "tolerance (see the file), or depends on something the short form leaves out; try --long")
        return f"exits {self.exit_code} standalone (something else failed): {self.output.strip()[-300:]}"


def find_case(case_id: str) -> Case:
    """The one case ``case_id`` names (an ID, or a pattern matching exactly one ID)."""
    from harness import catalog

    matches = catalog.select([case_id], exhaustive=True)
    exact = [c for c in matches if c.id == case_id]
    if exact:
        return exact[0]
    if len(matches) != 1:
        shown = ", ".join(c.id for c in matches[:5]) + (" ..." if len(matches) > 5 else "")
        raise UsageError(f"case {case_id!r} matches {len(matches)} cases ({shown}): give one case ID")
    return matches[0]


def observe(case: Case, impl_name: str, device: str, timeout: float = 300.0):
    """Run the case once with the harness and return its record.

    On CUDA the ranks use nccl when there is a GPU per rank, else gloo (ranks share the GPUs; gloo carries CUDA
    tensors), as the short file itself does, so that a case is observed on any number of GPUs.
    """
    from harness.engine.plan import execute, make_plan
    from harness.selection import Selection

    backend = None
    if device == "cuda":
        import torch

        backend = "nccl" if torch.cuda.device_count() >= case.world_size else "gloo"
    selection = Selection(impls=(impl_name,), device=device, backend=backend, timeout=timeout)
    records, _ = execute(make_plan(selection, diagnose=False, cases=[case]))
    return records[0]


def seen_line(record, case: Case) -> str:
    """Where the symptom was seen: build, mode, device, and whether a CUDA record confirms it."""
    mode = f" ({record.mode_text})" if record.mode_text and record.mode_text != "native" else ""
    impl = "" if record.impl == "torch" else f" with {record.impl} {record.impl_version or ''}".rstrip()
    line = (f"{record.status.value} on torch {record.torch_version}{mode}{impl}, {record.device}/{record.backend}, "
            f"syncbn-harness case {case.id}")
    if record.emulated:
        line += "; cpu-emulation, not yet confirmed on CUDA"
    return line


def write_short(case: Case, impl_name: str, record, path: Path, *, verify: bool = True,
                timeout: float = 600.0, title: str = "") -> Written:
    """Write the short form of ``record``'s failure of ``case`` to ``path`` (and run it once when ``verify``)."""
    from harness.impls.registry import resolve

    adapter = resolve(impl_name)
    reason = short.unexpressible(case, adapter)
    if reason:
        raise UsageError(f"{case.id}: {reason}; write the generated form with --long")
    if record.status.value not in FAILING:
        raise UsageError(f"{case.id} is {record.status.value} for {impl_name} here: there is no failure to "
                         "reproduce (the long form, --long, writes a file for any case)")
    try:
        symptom = symptom_of(record)
    except NoSymptom as exc:
        raise UsageError(f"{case.id}: {exc}") from None
    target = short.Target.of(adapter)
    if record.device == "cuda":
        # Seen on a GPU: the file runs there only, without the CPU stand-ins a cpu-emulation finding carries.
        target = target.gpu_only()
    path.write_text(short.source(case, target, symptom, seen=seen_line(record, case), title=title))
    path.chmod(0o755)
    written = Written(path, "short", record)
    if verify:
        try:
            proc = short.verify(path, timeout=timeout)
            written.exit_code, written.output = proc.returncode, proc.stdout[-2000:] + proc.stderr[-2000:]
            written.judged = SHOWN in proc.stdout
        except subprocess.TimeoutExpired:
            written.exit_code, written.output = 124, f"did not finish in {timeout:.0f} s"
    return written


def write_repro(case_id: str, impl_name: str, *, output: Optional[str] = None, device: Optional[str] = None,
                run_first: bool = True, timeout: float = 300.0, command: str = "", long: bool = False,
                verify: bool = True) -> Written:
    """Write the repro of ``case_id`` for ``impl_name`` (short form unless ``long``)."""
    from harness.selection import default_device

    from harness.impls.registry import resolve

    case = find_case(case_id)
    safe = case.id.replace("/", "_")
    path = Path(output or f"repro_{safe}_{impl_name.replace(':', '_').replace('.', '_')}.py").expanduser()
    if not long:
        reason = short.unexpressible(case, resolve(impl_name))
        if reason:
            raise UsageError(f"{case.id}: {reason}; write the generated form with --long")
        if not run_first:
            raise UsageError("the short form reproduces the failure the harness observes, so it runs the case "
                             "first: drop --no-run, or write the generated form with --long")
        record = observe(case, impl_name, device or default_device(), timeout)
        return write_short(case, impl_name, record, path, verify=verify)
    impl = resolve_impl(impl_name)
    if impl["kind"] == "torch" and device == "cpu":
        raise UsageError("--impl torch --device cpu cannot be standalone in the long form: torch.nn.SyncBatchNorm "
                         "refuses CPU input; use --device cuda (the default for torch), or the short form, which "
                         "carries CPU stand-ins for torch's CUDA ops")
    file_device = device or ("cuda" if impl["kind"] == "torch" else default_device())
    record = None
    if run_first:
        record = observe(case, impl_name, default_device() if impl["kind"] == "torch" else file_device, timeout)
    path.write_text(repro_source(case, impl_name, device=file_device, record=record, command=command,
                                 filename=path.name, timeout=timeout))
    path.chmod(0o755)
    return Written(path, "long", record)
