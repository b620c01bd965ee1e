"""``bench store``: ``report`` and a per-build reader over synthetic stores of 10k to 1M real records.

A store of that size is months of CI and search, so it is made here: real
records (from ``--from STORE``, else a small real run made now) serve as
templates, each serialized once with two placeholders (the case and the
commit) that are filled in as bytes, so a million lines cost a write, not a
million ``json.dumps``. The records are spread over ``--builds`` builds (the
build is the commit in ``torch_git_version``), each case made unique per build
(``<case>#<n>``), so every record is a latest one and ``report`` has all of
them to count.

Per size, each command runs in a child process of its own (its peak resident
memory as :func:`harness.procs.run_group` reads it), with the same interpreter:

- ``report (first)``: ``report`` on a store never indexed: the first indexing
  plus the report;
- ``report``: ``report`` again, over the index;
- ``diff``: ``diff`` of two builds, the per-build reader ``gate`` uses too;

and the size of the page ``report`` wrote.

With ``--baseline REF`` the same commands of that commit
(:func:`harness.bench.commands.export_baseline`) run on the same store, turn by
turn, for sizes up to ``--baseline-max`` records (a report that holds the
store in memory cannot do a million here) and the ratios are printed. Stores
are made in a temporary folder and removed, unless ``--keep DIR``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

from harness import procs
from harness.bench.commands import ROOT, Tree, export_baseline, python_path, repository_root
from harness.errors import UsageError
from harness.results.store import Store, build_key

TEMPLATE_CASES = ("module-config/*", "allgather-shape/*", "numerics/*")
TIMEOUT_S = 3600
_N, _GIT = b"@@N@@", b"@@GIT@@"


def templates(source: Optional[str], scratch: Path, echo: Callable[[str], None]) -> list[bytes]:
    """Record lines with placeholders: from a store, or from a small real run made now."""
    if source is None:
        source = str(scratch / "templates")
        echo(f"making template records: run --impl reference --impl torch {' '.join(TEMPLATE_CASES)}")
        cmd = [sys.executable, "-m", "harness", "run", "--device", "cpu", "--impl", "reference", "--impl", "torch",
               "--no-diagnose", "--store", source, *[a for c in TEMPLATE_CASES for a in ("--case", c)]]
        done = procs.run_group(cmd, timeout=TIMEOUT_S)
        if done.timed_out or done.code not in (0, 1):
            raise RuntimeError(f"the template run failed ({'timed out' if done.timed_out else done.code}): "
                               f"{done.err[-2000:]}")
    records = Store(source).read()
    if not records:
        raise UsageError(f"--from {source} holds no records: give a store that a run wrote")
    out = []
    for r in records:
        d = r.to_dict()
        d["case"], d["torch_git_version"] = f"{r.case}#{_N.decode()}", _GIT.decode()
        out.append((json.dumps(d, sort_keys=True) + "\n").encode())
    return out


def make_store(path: Path, lines: list[bytes], records: int, builds: int) -> int:
    """Write ``records`` records over ``builds`` builds into a new store at ``path``; returns its bytes."""
    path.mkdir(parents=True)
    probe = json.loads(lines[0].decode())
    per_build, size = records // builds, 0
    for b in range(builds):
        git = f"{b + 1:012x}" + "0" * 28  # the build key keeps the first 12 digits
        key = build_key(probe["torch_version"], git, probe["device"], probe["backend"])
        with open(path / f"{key}.jsonl", "wb", buffering=1 << 20) as f:
            for i in range(per_build):
                f.write(lines[i % len(lines)].replace(_GIT, git.encode()).replace(_N, str(i).encode()))
        size += (path / f"{key}.jsonl").stat().st_size
    return size


def measure(tree: Tree, args: list[str], cwd: Path) -> tuple[float, float]:
    """Wall seconds and peak resident MiB (``wait4``'s ``ru_maxrss``) of ``python -m harness ARGS`` in ``tree``."""
    cmd = [sys.executable, "-m", "harness", *args]
    done = procs.run_group(cmd, timeout=TIMEOUT_S, cwd=cwd, env={**os.environ, **tree.env},
                           stdout=subprocess.DEVNULL)
    if done.timed_out:
        raise RuntimeError(f"{tree.label}: `{' '.join(args)}` took more than {TIMEOUT_S}s")
    if done.code not in (0, 1):
        raise RuntimeError(f"{tree.label}: `{' '.join(args)}` exited {done.code}: {done.err[-1500:]}")
    return done.wall_s, done.peak_mib


def bench_store(sizes: tuple[int, ...], builds: int, source: Optional[str], baseline: Optional[str],
                baseline_max: int, keep: Optional[str], echo: Callable[[str], None] = print) -> list[dict]:
    """Make each store, time the commands in this tree (and the baseline's), print and return the rows."""
    if any(n < builds for n in sizes):
        raise UsageError(f"--records {min(sizes)} is fewer than --builds {builds}: give at least one record a build")
    here = ROOT
    scratch = Path(tempfile.mkdtemp(prefix="syncbn-bench-store-", dir=keep))
    rows = []
    try:
        trees = [Tree("this tree", here, python_path(here))]
        if baseline:
            trees.insert(0, export_baseline(repository_root(here), baseline, scratch))
        lines = templates(source, scratch, echo)
        echo(f"{len(lines)} template records; {builds} builds; {', '.join(t.label for t in trees)}; "
             f"{os.cpu_count()} CPUs")
        for n in sizes:
            t0 = time.perf_counter()
            store = scratch / f"store-{n}"
            size = make_store(store, lines, n, builds)
            echo(f"{n} records, {size / 2**30:.2f} GiB, made in {time.perf_counter() - t0:.0f}s")
            keys = Store(store).builds()
            commands = {"report (first)": ["report", "--store", str(store), "--out", str(scratch / "out")],
                        "report": ["report", "--store", str(store), "--out", str(scratch / "out")],
                        "diff": ["diff", keys[0], keys[1], "--store", str(store)]}
            for tree in trees:
                if tree.label != "this tree" and n > baseline_max:
                    continue
                for name, args in commands.items():
                    if name == "report (first)":
                        for index in store.glob(".syncbn-index*"):
                            index.unlink()
                    wall, rss = measure(tree, args, scratch)
                    page = scratch / "out" / "index.html"
                    row = {"records": n, "bytes": size, "tree": tree.label, "command": name, "wall_s": wall,
                           "peak_mib": rss, "page_bytes": page.stat().st_size if name.startswith("report") else None}
                    rows.append(row)
                    shown = f"  page {row['page_bytes'] / 2**20:.1f} MiB" if row["page_bytes"] is not None else ""
                    echo(f"  {tree.label:22s} {name:15s} {wall:8.1f} s  {rss:8.0f} MiB peak{shown}")
            if baseline and n <= baseline_max:
                echo("  " + ratios([r for r in rows if r["records"] == n], trees[0].label))
            shutil.rmtree(store)
        return rows
    finally:
        if keep is None:
            shutil.rmtree(scratch, ignore_errors=True)


def ratios(rows: list[dict], baseline_label: str) -> str:
    """``this tree / baseline``: per command, wall time and peak memory."""
    by = {(r["tree"], r["command"]): r for r in rows}
    parts = []
    for (tree, command), r in by.items():
        base = by.get((baseline_label, command))
        if tree == "this tree" and base:
            parts.append(f"{command}: {r['wall_s'] / base['wall_s']:.2f}x time, "
                         f"{r['peak_mib'] / base['peak_mib']:.2f}x memory")
    return "ratios (this tree / baseline): " + "; ".join(parts)
