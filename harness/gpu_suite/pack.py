"""Packing the suite's work folder into the few files a lent machine sends back, and the summary in them.

A lent GPU machine returns at most 8 files, two folders deep, so the output
folder gets exactly :data:`FILES` (those that exist): the whole work folder
(store, report, logs, fidelity table, profiles) as one tarball, and beside it
what a reader looks at first and what is committed as the run's evidence:
``steps.json``, ``summary.md``, ``machine.json``, ``bench.json``, the CUDA
tests' JUnit XML, ``records.csv`` (one line per record: case, implementation,
status, worst error over its tolerance) and ``console.txt``. Packing runs
whatever happened before it (a failed or stopped step, no GPU), and only ever
writes these names.

``summary.md`` is :func:`harness.gpu_suite.tables.summary` of the work
folder: every table made from the raw files beside it.
"""

from __future__ import annotations

import csv
import json
import math
import shutil
import tarfile
from pathlib import Path
from typing import Optional

from harness.gpu_suite import tables
from harness.gpu_suite.machine import Machine

FILES = ("suite.tar.gz", "steps.json", "summary.md", "machine.json", "bench.json", "console.txt", "records.csv",
         "pytest-cuda.xml")
COPIED = ("steps.json", "summary.md", "machine.json", "bench.json", "records.csv", "pytest-cuda.xml")
RECORD_COLUMNS = ("case", "family", "impl", "mode", "device", "backend", "status", "known", "worst_ratio",
                  "worst_tensor", "message")


def clear(out: Path) -> None:
    """Remove a previous run's packed files from ``out`` (only the names this module writes)."""
    for name in FILES:
        if name != "console.txt":
            (out / name).unlink(missing_ok=True)


def pack(work: Path, out: Path, machine: Optional[Machine], date: str) -> list[Path]:
    """Write ``machine.json``, ``records.csv`` and the summary into ``work``, copy the small files and tar the work
    folder into ``out``; the files written."""
    out.mkdir(parents=True, exist_ok=True)
    if machine is not None:
        (work / "machine.json").write_text(json.dumps(machine.to_json(), indent=2), encoding="utf-8")
    records_csv(work, work / "records.csv")
    (work / "summary.md").write_text(tables.summary(work, date), encoding="utf-8")
    for name in COPIED:
        if (work / name).is_file() and (work / name).stat().st_size:
            shutil.copyfile(work / name, out / name)
    with tarfile.open(out / "suite.tar.gz", "w:gz") as tar:
        tar.add(work, arcname="gpu-suite")
    return [out / n for n in FILES if (out / n).exists()]


def records_csv(work: Path, path: Path) -> int:
    """One line per latest record of the suite's store (:data:`RECORD_COLUMNS`); how many (none: no file)."""
    from harness.judge.metric import worst_ratio
    from harness.results.store import Store, latest

    path.unlink(missing_ok=True)
    try:
        records = latest(Store(work / "results").read()) if (work / "results").is_dir() else []
    except Exception as exc:  # noqa: BLE001 - said in the summary's place of the table; the tarball keeps the store
        (work / "records-error.txt").write_text(f"the store could not be read: {type(exc).__name__}: {exc}\n")
        return 0
    if not records:
        return 0
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(RECORD_COLUMNS)
        for r in sorted(records, key=lambda r: (r.impl, r.backend, r.case)):
            ratio = worst_ratio(r.metrics.values())
            worst = max(r.metrics, key=lambda k: -1.0 if math.isnan(r.metrics[k].ratio) else r.metrics[k].ratio,
                        default="")
            known = "" if not r.known_issue else ("known" if r.known_issue.matched else
                                                  "now passes" if r.known_issue.now_passes else "other failure")
            w.writerow([r.case, r.family, r.impl, r.mode_text, r.device, r.backend, str(r.status), known,
                        "" if ratio is None else f"{ratio:.4g}", worst if ratio is not None else "",
                        " ".join(r.message.split())[:240]])
    return len(records)
