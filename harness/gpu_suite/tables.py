"""The tables of a GPU run, each made from one of the run's raw files (pure: files in, Markdown out).

One renderer per section, each reading only the files a run leaves (in the
suite's work folder while it runs, in ``docs/gpu-runs/<run>/`` once filed):

========== =============================================================
machine    ``machine.json``: GPU, driver, torch, NCCL, toolkit, harness commit
steps      ``steps.json``: each step's outcome, exit, time, limit, why not run
tests      ``pytest-cuda.xml`` (``pytest.xml`` in a bare run): the CUDA tests'
           counts and every failure
records    ``records.csv``: records per implementation and status, and
           every unexpected failure
bench      ``bench.json``: reference time over torch's per op and shape,
           statistics pass over copy bandwidth, which shapes meet the goal
repros     ``repros.json``: each standalone repro's verdict and its line
fidelity   ``fidelity.md``: cpu-emulation against CUDA, as ``fidelity`` wrote it
ncu        ``ncu.md``: the Nsight Compute table, as the profile step wrote it
nccl       ``nccl-probe.json``: whether NCCL put two ranks on one GPU
========== =============================================================

The suite's ``summary.md`` is these sections in order; ``docs/gpu-results.md``
embeds the same renderings between markers, and a test renders them again
from ``docs/gpu-runs/`` and fails where the page disagrees
(:mod:`harness.gpu_suite.evidence`).
"""

from __future__ import annotations

import csv
import json
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Callable

from harness.judge.status import FAILURES as FAILING
from harness.judge.status import Status

STATUSES = tuple(s.value for s in Status)  # the records.csv column's words, in the tables' column order
FAILURES = tuple(s.value for s in Status if s in FAILING)
BENCH_OPS = ("welford_stats", "batch_norm_stats", "batch_norm_elemt", "batch_norm_backward_reduce",
             "batch_norm_backward_elemt")
GOAL_RATIO, GOAL_BANDWIDTH = 1.2, 0.6  # every op within 1.2x of torch's; statistics at 60% of copy bandwidth


def _json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _cell(text, width: int = 240) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= width else text[:width - 3] + "..."


def machine(folder: Path) -> str:
    m = _json(folder / "machine.json")
    if not m:
        return "no machine.json"
    gpus = ", ".join(f"{g['name']} (sm {g['capability']}, {g['memory_gib']} GiB, {g.get('multiprocessors')} SMs)"
                     for g in m.get("gpus", [])) or "no GPU"
    h = m.get("harness") or {}
    clean = {True: "clean tree", False: "uncommitted changes", None: "tree state unknown"}[h.get("clean")]
    nccl = ".".join(map(str, m["nccl"])) if m.get("nccl") else "none"
    rows = [("GPU", gpus), ("driver", m.get("driver")),
            ("torch", f"{m.get('torch')} (git {str(m.get('torch_git'))[:12]}), CUDA {m.get('torch_cuda')}, "
                      f"NCCL {nccl}"),
            ("toolchain", f"{m.get('nvcc')}; ncu {m.get('ncu') or 'not found'}"),
            ("host", f"Python {m.get('python')}, {m.get('cpus')} CPUs"),
            ("harness", f"commit {h.get('commit')} ({clean}; from {h.get('source')})")]
    return "\n".join(["| | |", "| --- | --- |"] + [f"| {k} | {_cell(v, 400)} |" for k, v in rows])


def steps(folder: Path) -> str:
    data = _json(folder / "steps.json")
    if not data or not data.get("steps"):
        return "no steps ran" + (f" ({data['error']})" if data and data.get("error") else "")
    lines = [f"Budget {data.get('budget_s', 0):.0f} s.", "",
             "| step | outcome | exit | seconds | limit | why not run |", "| --- | --- | --- | --- | --- | --- |"]
    for s in data["steps"]:
        code = "" if s["exit"] is None else s["exit"]
        lines.append(f"| {s['step']} | {s['outcome']} | {code} | {s['seconds']:.0f} | {s['limit_s']} | "
                     f"{_cell(s.get('reason', ''), 200)} |")
    return "\n".join(lines)


def tests(folder: Path) -> str:
    xml = next((folder / n for n in ("pytest-cuda.xml", "pytest.xml") if (folder / n).is_file()),
               folder / "pytest-cuda.xml")  # the suite's name, or a bare run's
    try:
        root = ET.parse(xml).getroot()
    except (OSError, ET.ParseError):
        return "not run"
    suites = [root] if root.tag == "testsuite" else list(root)
    n = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
    lines = [f"{n['tests']} tests: {passed} passed, {n['failures']} failed, {n['errors']} errors, "
             f"{n['skipped']} skipped"]
    for case in root.iter("testcase"):
        for bad in list(case.findall("failure")) + list(case.findall("error")):
            first = (bad.get("message") or "").strip().splitlines()[:1]
            lines.append(f"- `{case.get('name')}`: {_cell(first[0] if first else bad.tag, 200)}")
        for skip in case.findall("skipped"):
            lines.append(f"- skipped `{case.get('name')}`: {_cell(skip.get('message') or '', 200)}")
    return "\n".join(lines)


def read_records(folder: Path) -> list[dict]:
    """The rows of ``records.csv`` (empty when there is none)."""
    try:
        with open(folder / "records.csv", newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    except OSError:
        return []


def records(folder: Path) -> str:
    rows = read_records(folder)
    if not rows:
        return "no records"
    lines = ["| implementation (mode) | backend | records | " + " | ".join(STATUSES) + " |",
             "| --- | --- | --- |" + " --- |" * len(STATUSES)]
    for impl, backend in sorted({(r["impl"], r["backend"]) for r in rows}):
        mine = [r for r in rows if r["impl"] == impl and r["backend"] == backend]
        modes = ", ".join(sorted({r["mode"] or "-" for r in mine}))
        counts = Counter(r["status"] for r in mine)
        known = Counter(r["status"] for r in mine if r["known"] == "known")
        cells = [f"{counts[s]}" + (f" ({known[s]} known)" if known[s] else "") for s in STATUSES]
        lines.append(f"| {impl} ({modes}) | {backend} | {len(mine)} | " + " | ".join(cells) + " |")
    bad = [r for r in rows if r["status"] in FAILURES and r["known"] != "known"]
    lines += ["", f"Unexpected failures: {len(bad)}" + (" (first 40)" if len(bad) > 40 else "")]
    for r in bad[:40]:
        lines.append(f"- {r['impl']} `{r['case']}` ({r['backend']}): {r['status']}: {_cell(r['message'], 220)}")
    passing = [r for r in rows if r["known"] == "now passes"]
    if passing:
        lines += ["", f"Known issues that now pass: {len(passing)}"]
        lines += [f"- {r['impl']} `{r['case']}`" for r in passing[:20]]
    return "\n".join(lines)


def meets_goal(figure: dict) -> bool:
    """Every op within :data:`GOAL_RATIO` of torch's and the statistics pass at :data:`GOAL_BANDWIDTH` of copy."""
    ratios = [figure["ops"][op]["reference_over_torch"] for op in BENCH_OPS if op in figure["ops"]]
    return all(r <= GOAL_RATIO for r in ratios) and figure["stats_over_copy_bandwidth"] >= GOAL_BANDWIDTH


def bench(folder: Path) -> str:
    figures = _json(folder / "bench.json")
    if not figures:
        return "not measured"
    seq = all("sequence_over_torch" in f for f in figures)
    lines = ["Reference CUDA kernel time over torch's CUDA kernel time on the same tensors (median of CUDA-event "
             "timings; above 1: the reference is slower); the statistics pass's bandwidth over a device copy's, "
             "measured in the same run. fwd+bwd: " + ("the reference's op sequence for one training step over "
                                                       "torch SyncBatchNorm's" if seq else
                                                       "the reference SyncBatchNorm against F.batch_norm") + ".",
             "", "| shape | " + " | ".join(BENCH_OPS) + " | fwd+bwd | stats / copy bandwidth | goal met |",
             "| --- |" + " --- |" * (len(BENCH_OPS) + 3)]
    for f in figures:
        cells = [f"{f['ops'][op]['reference_over_torch']:.2f}" if op in f["ops"] else "" for op in BENCH_OPS]
        whole = f["sequence_over_torch"] if seq else f["reference_over_torch"]
        lines.append(f"| {f['shape']} | " + " | ".join(cells) + f" | {whole:.2f} | "
                     f"{f['stats_over_copy_bandwidth']:.2f} ({f['stats_gbps']:.0f} of {f['copy_gbps']:.0f} GB/s) | "
                     f"{'yes' if meets_goal(f) else 'no'} |")
    met = sum(meets_goal(f) for f in figures)
    worst = max((f["ops"][op]["reference_over_torch"], op, f["shape"]) for f in figures for op in BENCH_OPS
                if op in f["ops"])
    lines += ["", f"Goal (every op within {GOAL_RATIO}x of torch's, statistics at {GOAL_BANDWIDTH:.0%} or more of copy "
                  f"bandwidth) met on {met} of {len(figures)} shapes; worst op ratio {worst[0]:.2f} ({worst[1]}, "
                  f"{worst[2]})."]
    return "\n".join(lines)


def repros(folder: Path) -> str:
    verdicts = _json(folder / "repros.json")
    if not verdicts:
        return "none run"
    lines = ["| file | verdict | exit | seconds | what it printed |", "| --- | --- | --- | --- | --- |"]
    for v in verdicts:
        lines.append(f"| `{v['file']}` | {v['verdict']} | {v['exit']} | {v['seconds']:.0f} | {_cell(v['line'])} |")
    counts = Counter(v["verdict"] for v in verdicts)
    lines += ["", ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) + f", of {len(verdicts)} files."]
    return "\n".join(lines)


def _text(name: str, absent: str) -> Callable[[Path], str]:
    def render(folder: Path) -> str:
        path = folder / name
        return path.read_text(encoding="utf-8").strip() if path.is_file() else absent

    render.__name__ = name
    return render


def nccl(folder: Path) -> str:
    found = _json(folder / "nccl-probe.json")
    if not found:
        return "not probed"
    if found.get("works") is None:
        return f"not probed: {found.get('why')}"
    version = ".".join(map(str, found["nccl"]))
    if found["works"]:
        return f"NCCL {version}: two ranks on one GPU work (NCCL_MULTI_RANK_GPU_ENABLE=1)."
    return "\n".join([f"NCCL {version}: two ranks on one GPU refused, NCCL_MULTI_RANK_GPU_ENABLE=1 set:"] + [
        f"- rank {r['rank']}: {_cell(r['error'] or '', 300)}" for r in found["ranks"]])


SECTIONS: dict[str, tuple[str, Callable[[Path], str]]] = {
    "machine": ("Machine", machine),
    "steps": ("Steps", steps),
    "tests": ("CUDA kernel tests (`pytest -m cuda`)", tests),
    "records": ("Records on CUDA", records),
    "fidelity": ("cpu-emulation against CUDA", _text("fidelity.md", "not compared")),
    "bench": ("Benchmark (`bench kernels --device cuda`)", bench),
    "ncu": ("Nsight Compute profile", _text("ncu.md", "not profiled")),
    "nccl": ("NCCL, two ranks on one GPU", nccl),
    "repros": ("Standalone repros", repros),
}


def render(section: str, folder: Path) -> str:
    """One section's table from ``folder``'s files (KeyError names the valid sections)."""
    if section not in SECTIONS:
        raise KeyError(f"unknown section {section!r}: one of {', '.join(SECTIONS)}")
    return SECTIONS[section][1](folder)


def summary(folder: Path, date: str) -> str:
    """``summary.md``: every section, in order."""
    out = [f"# GPU suite, {date}"]
    for title, fn in SECTIONS.values():
        out += ["", f"## {title}", "", fn(folder)]
    return "\n".join(out) + "\n"
