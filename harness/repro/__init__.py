"""``repro``: a standalone Python file that reproduces one (case, implementation).

Two forms:
- the short form (the default; :mod:`harness.repro.short`, what the file
  states in :mod:`harness.repro.short_file`, its literal blocks in
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

Why each form is written the way it is: the long form is the harness's own
code, so it copies live, tested modules through ``ast`` and writes nothing
from a template (a copy cannot drift from what the harness checks, and a
maintainer may read it as the harness's source). The short form is not the
harness's code: it is a hundred lines a maintainer reads first, so it is
made of literal blocks (:mod:`harness.repro.short_text`, raw strings that
are exactly what the file holds), chosen and filled with the case's
constants by a :class:`~harness.repro.short_file.ShortFile`; only the
docstring and the constants are generated. Both are kept honest the same
way: tests write files and run them without the harness.
"""

from __future__ import annotations

import enum
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from harness.catalog.case import Case
from harness.errors import UsageError
from harness.impls.base import Impl
from harness.repro import short
from harness.repro.long import Kind, repro_source, resolve_impl
from harness.repro.symptom import NoSymptom, symptom_of
from harness.judge.status import FAILURES
from harness.results.records import Record

__all__ = ["Form", "Written", "find_case", "observe", "repro_source", "seen_line", "write_repro", "write_short"]


# What a short file prints when it judged the symptom present (its exit code alone does not say it).
SHOWN = "SYMPTOM SHOWS"


class Form(enum.Enum):
    """The two forms of a repro file (see the module docstring)."""

    SHORT = "short"
    LONG = "long"


@dataclass
class Written:
    """A written repro file: its form, the record it reproduces, and what running it alone gave."""

    path: Path
    form: Form
    record: Optional[Record] = None  # the harness's record of the case (None with --no-run)
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
        if self.exit_code == 2 and "needs a GPU" in self.output:
            return "needs a GPU (exit 2 here, where there is none)"
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


def write_short(case: Case, impl_name: str, record: Record, path: Path, *, verify: bool = True,
                timeout: float = 600.0, title: str = "", cpu_demo: bool = False) -> Written:
    """Write the short form of ``record``'s failure of ``case`` to ``path`` (and run it once when ``verify``);
    ``cpu_demo``: torch's CPU demonstration over stand-ins for its CUDA ops instead (:mod:`harness.repro.short`)."""
    from harness.impls.registry import resolve

    adapter = resolve(impl_name)
    _check_expressible(case, adapter)
    return _write_short(case, adapter, record, path, verify=verify, timeout=timeout, title=title,
                        cpu_demo=cpu_demo)


def _check_expressible(case: Case, adapter: Impl) -> None:
    reason = short.unexpressible(case, adapter)
    if reason:
        raise UsageError(f"{case.id}: {reason}; write the generated form with --long")


def _write_short(case: Case, adapter: Impl, record: Record, path: Path, *, verify: bool, timeout: float = 600.0,
                 title: str = "", cpu_demo: bool = False) -> Written:
    """:func:`write_short` for an adapter the short form can express."""
    if record.status not in FAILURES:
        raise UsageError(f"{case.id} is {record.status.value} for {adapter.key} here: there is no failure to "
                         "reproduce (the long form, --long, writes a file for any case)")
    try:
        symptom = symptom_of(record)
    except NoSymptom as exc:
        raise UsageError(f"{case.id}: {exc}") from None
    target = short.Target.of(adapter)
    if cpu_demo and not target.on_cuda:
        raise UsageError(f"--cpu-demo is for torch's layer, whose ops have CUDA kernels only; {adapter.key}'s file "
                         + ("needs a GPU whatever stands in" if target.cuda_only else "runs on CPU as it is"))
    if not cpu_demo:
        # The evidence: on CUDA only, without the CPU stand-ins (never evidence of CUDA's behaviour).
        target = target.gpu_only()
    path.write_text(short.source(case, target, symptom, seen=seen_line(record, case), title=title))
    path.chmod(0o755)
    written = Written(path, Form.SHORT, record)
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
                verify: bool = True, cpu_demo: bool = False) -> Written:
    """Write the repro of ``case_id`` for ``impl_name`` (short form unless ``long``); the name is resolved once,
    and the adapter (or how the long file loads it) is passed down."""
    from harness.selection import default_device

    from harness.impls.registry import resolve

    case = find_case(case_id)
    safe = case.id.replace("/", "_")
    path = Path(output or f"repro_{safe}_{impl_name.replace(':', '_').replace('.', '_')}.py").expanduser()
    if not long:
        adapter = resolve(impl_name)
        _check_expressible(case, adapter)
        if not run_first:
            raise UsageError("the short form reproduces the failure the harness observes, so it runs the case "
                             "first: drop --no-run, or write the generated form with --long")
        record = observe(case, impl_name, device or default_device(), timeout)
        return _write_short(case, adapter, record, path, verify=verify, cpu_demo=cpu_demo)
    if cpu_demo:
        raise UsageError("--cpu-demo writes the short form's CPU demonstration: drop --long")
    loading = resolve_impl(impl_name)
    if loading.kind is Kind.TORCH and device == "cpu":
        raise UsageError("--impl torch --device cpu cannot be standalone in the long form: torch.nn.SyncBatchNorm "
                         "refuses CPU input; use --device cuda (the default for torch), or the short form with "
                         "--cpu-demo, a CPU demonstration over stand-ins for torch's CUDA ops")
    file_device = loading.file_device(device, default_device())
    record = None
    if run_first:
        record = observe(case, impl_name, default_device() if loading.kind is Kind.TORCH else file_device, timeout)
    path.write_text(repro_source(case, impl_name, device=file_device, record=record, command=command,
                                 filename=path.name, timeout=timeout, loading=loading))
    path.chmod(0o755)
    return Written(path, Form.LONG, record)
