"""Packing the suite's work folder into the few files a lent machine sends back, and the summary in them.

A lent GPU machine returns at most 8 files, two folders deep, so the output
folder gets exactly :data:`FILES` (those that exist): the whole work folder
(store, report, logs, test XML, fidelity table) as one tarball, and beside it
what a reader looks at first: ``steps.json``, ``summary.md``, ``machine.json``,
``bench.json`` and ``console.txt``. Packing runs whatever happened before it
(a failed or stopped step, no GPU), and only ever writes these names.

:func:`summary` turns the work folder into ``summary.md``: the machine, each
step's outcome and time, the CUDA kernel tests' counts, the records per
implementation and status (and every unexpected failure), the fidelity table,
the benchmark's ratios and each standalone repro's verdict.
"""

from __future__ import annotations

import json
import shutil
import tarfile
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Optional

FILES = ("suite.tar.gz", "steps.json", "summary.md", "machine.json", "bench.json", "console.txt")
REPRO_VERDICTS = {0: "does not show (fixed or absent here)", 1: "SHOWS the symptom", 2: "could not run"}


def clear(out: Path) -> None:
    """Remove a previous run's packed files from ``out`` (only the names this module writes)."""
    for name in FILES:
        if name != "console.txt":
            (out / name).unlink(missing_ok=True)


def pack(work: Path, out: Path, machine: Optional[dict], date: str) -> list[Path]:
    """Write the summary, copy the small files and tar the work folder into ``out``; the files written."""
    out.mkdir(parents=True, exist_ok=True)
    (work / "summary.md").write_text(summary(work, machine, date), encoding="utf-8")
    if machine is not None:
        (out / "machine.json").write_text(json.dumps(machine, indent=2), encoding="utf-8")
    for name in ("steps.json", "summary.md", "bench.json"):
        if (work / name).is_file() and (work / name).stat().st_size:
            shutil.copyfile(work / name, out / name)
    with tarfile.open(out / "suite.tar.gz", "w:gz") as tar:
        tar.add(work, arcname="gpu-suite")
    return [out / n for n in FILES if (out / n).exists()]


def _steps(work: Path) -> list[dict]:
    try:
        return json.loads((work / "steps.json").read_text())["steps"]
    except (OSError, ValueError, KeyError):
        return []


def _junit(path: Path) -> Optional[str]:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else list(root)
    n = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
    lines = [f"{n['tests']} tests: {passed} passed, {n['failures']} failed, {n['errors']} errors, "
             f"{n['skipped']} skipped"]
    for case in root.iter("testcase"):
        for bad in list(case.findall("failure")) + list(case.findall("error")):
            first = (bad.get("message") or "").strip().splitlines()[:1]
            lines.append(f"- `{case.get('name')}`: {first[0][:200] if first else bad.tag}")
    return "\n".join(lines)


def _records(work: Path) -> list[str]:
    from harness.results.records import FAILURES
    from harness.results.store import Store, latest

    try:
        records = latest(Store(work / "results").read())
    except Exception as exc:  # noqa: BLE001 - the summary says why, the tarball keeps the store
        return [f"the store could not be read: {type(exc).__name__}: {exc}"]
    if not records:
        return ["no records"]
    lines = ["| implementation (mode) | records | " + " | ".join(s for s in ("pass", "mismatch", "error", "crash",
                                                                          "hang", "unsupported", "skipped")) + " |",
             "| --- | --- |" + " --- |" * 7]
    for impl in sorted({r.impl for r in records}):
        mine = [r for r in records if r.impl == impl]
        modes = ", ".join(sorted({r.mode or "-" for r in mine}))
        counts = Counter(str(r.status) for r in mine)
        known = Counter(str(r.status) for r in mine if r.known_issue and r.known_issue.matched)
        cells = [f"{counts[s]}" + (f" ({known[s]} known)" if known[s] else "") for s in
                 ("pass", "mismatch", "error", "crash", "hang", "unsupported", "skipped")]
        lines.append(f"| {impl} ({modes}) | {len(mine)} | " + " | ".join(cells) + " |")
    bad = [r for r in records if r.status in FAILURES and not (r.known_issue and r.known_issue.matched)]
    lines += ["", f"Unexpected failures: {len(bad)}" + (" (first 40)" if len(bad) > 40 else "")]
    for r in bad[:40]:
        msg = " ".join(r.message.split())[:220]
        lines.append(f"- {r.impl} `{r.case}` ({r.backend}): {r.status}: {msg}")
    return lines


def _bench(work: Path) -> list[str]:
    try:
        figures = json.loads((work / "bench.json").read_text())
    except (OSError, ValueError):
        return ["not measured"]
    ops = ("welford_stats", "batch_norm_stats", "batch_norm_elemt", "batch_norm_backward_reduce",
           "batch_norm_backward_elemt")
    lines = ["Reference CUDA kernel time / torch's CUDA kernel time on the same tensors (median of CUDA-event "
             "timings; below 1: the reference is faster); statistics pass bandwidth / device copy bandwidth "
             "measured in the same run.", "",
             "| shape | " + " | ".join(ops) + " | fwd+bwd | stats / copy bandwidth |", "| --- |" + " --- |" * 7]
    for f in figures:
        cells = [f"{f['ops'][op]['reference_over_torch']:.2f}" for op in ops]
        lines.append(f"| {f['shape']} | " + " | ".join(cells) + f" | {f['reference_over_torch']:.2f} | "
                     f"{f['stats_over_copy_bandwidth']:.2f} ({f['stats_gbps']:.0f} of {f['copy_gbps']:.0f} GB/s) |")
    return lines


def _repros(work: Path, steps: list[dict]) -> list[str]:
    lines = []
    for s in steps:
        if not s["step"].startswith("repro "):
            continue
        verdict = REPRO_VERDICTS.get(s["exit"], s["outcome"]) if s["outcome"] != "not run" else "not run"
        try:
            tail = [x for x in (work / "logs" / s["log"]).read_text(errors="replace").splitlines() if x.strip()][-3:]
        except OSError:
            tail = []
        lines.append(f"- `{s['step'][6:]}`: exit {s['exit']}, {verdict}")
        lines += [f"  > {x[:200]}" for x in tail]
    return lines or ["none run"]


def summary(work: Path, machine: Optional[dict], date: str) -> str:
    """``summary.md`` for the work folder as it is now."""
    steps = _steps(work)
    gpu = ", ".join(f"{g['name']} (sm {g['capability']}, {g['memory_gib']} GiB)" for g in (machine or {}).get(
        "gpus", [])) or "no GPU"
    m = machine or {}
    out = [f"# GPU suite, {date}", "",
           f"{gpu}; driver {m.get('driver')}; torch {m.get('torch')} (CUDA {m.get('torch_cuda')}, git "
           f"{str(m.get('torch_git'))[:12]}); {m.get('nvcc')}; Python {m.get('python')}; {m.get('cpus')} CPUs.", "",
           "## Steps", "", "| step | outcome | exit | seconds | limit |", "| --- | --- | --- | --- | --- |"]
    out += [f"| {s['step']} | {s['outcome']} | {s['exit']} | {s['seconds']:.0f} | {s['limit_s']} |" for s in steps]
    tests = _junit(work / "pytest-cuda.xml")
    out += ["", "## CUDA kernel tests (`pytest -m cuda`)", "", tests or "not run"]
    out += ["", "## Records on CUDA", ""] + _records(work)
    fid = work / "fidelity.md"
    out += ["", "## cpu-emulation against CUDA (torch)", "", fid.read_text() if fid.is_file() else "not compared"]
    out += ["", "## Benchmark (`bench kernels --device cuda`)", ""] + _bench(work)
    out += ["", "## Standalone repros", ""] + _repros(work, steps)
    return "\n".join(out) + "\n"
