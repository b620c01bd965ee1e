"""``bench run``: whole commands of this tree timed against a baseline commit's, in the same sitting.

These machines are noisy and absolute times drift by tens of percent between
hours, so a figure is only ever a ratio of two trees measured here, now, with
the same interpreter and torch, turn by turn (baseline, this tree, baseline, ...)
so that a slow minute costs both.

The baseline is a commit of this tree's git repository, exported (``git
archive``) into a temporary folder and run from there with ``PYTHONPATH``
pointing at it: its ``harness`` package shadows the installed one, and the two
top-level folders an install maps into the package (``cases/``, ``kernels/``)
are linked into it. Both trees share the harness cache (built kernels,
inductor's compiled code), so neither pays a build the other does not; each
figure runs once untimed first (``--warmup``) for the same reason.

Figures (every one a command line, the same for both trees):
- ``startup``: ``list impls`` (imports and adapters, no rank);
- ``check-one``, ``run-one``: one small case;
- ``layer``: the default selection's cases whose families run the layer scenario;
- ``ddp``, ``compile``: those families of the default selection;
- ``default``: the whole default selection with ``--impl torch``;
- ``impls-N`` (N = 1, 3, 10): a small layer selection run by N implementations at
  once (the reference, torch, the test suite's textbook SyncBN and its planted
  defects); the ratio of N to 1 says how a run scales with implementations;
- ``search``: ``search`` of the reference over :data:`SEARCH_CASES` generated cases
  (seed 0: the same cases in both trees): a correct implementation's search rate;
- ``search-fail``: the same over :data:`SEARCH_FAIL_CASES` cases of an implementation that
  raises on every rank (:data:`FAILING_PLUGIN`, written by the bench): the rate when every case
  fails, where a pool restart per failure used to dominate.

Both search figures also give the rate the search itself reports, cases explored per second of
exploring (start-up and shrinking left out), the median of each tree's runs.

Each is timed ``--repeat`` times per tree (the median is reported); records
go to a temporary store removed afterwards, as is the exported baseline. A
command runs in a session of its own, and the next starts only once every
process of that session has ended (untimed): what one tree leaves running after
its command returns must not be charged to the other tree's next turn.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from harness import procs
from harness.engine.forkserver import LIGHT_FAMILIES
from harness.errors import UsageError

ONE_CASE = "module-config/affine-off/ws2"
# The default selection's layer families: the forkserver's light ones, less cuda-graph (a GPU family).
LAYER_FAMILIES = tuple(f for f in LIGHT_FAMILIES if f != "cuda-graph")
SCALING_CASES = ("module-config/*", "numerics/*", "channels-last/*")
# Implementations for the scaling figure: the built-in two, then plugins of the test suite (tests/support).
SCALING_IMPLS = ("reference", "torch", "textbook:TextbookSyncBN", "defects:EqualWeightMerge", "defects:NaiveVariance",
                 "defects:BiasedRunningVar", "defects:EpsOutsideSqrt", "defects:HalfCounts",
                 "defects:MomentumNoneAsDefault", "defects:NormalizesInPlace")
FIGURES = ("startup", "check-one", "run-one", "layer", "ddp", "compile", "default", "impls-1", "impls-3", "impls-10",
           "search", "search-fail")
SEARCH_CASES = 60
SEARCH_FAIL_CASES = 40
# The implementation the search-fail figure searches: torch's SyncBatchNorm whose forward raises on every rank,
# written by the bench into a folder both trees import from (a baseline commit has no such plugin of its own).
FAILING_PLUGIN = ("syncbn_bench_fails", '''"""What `bench run`'s search-fail figure searches: every case fails alike."""
import torch


class RaisesOnEveryRank(torch.nn.SyncBatchNorm):
    def forward(self, input):
        raise ValueError("bench: raises on every rank, before any collective")
''')
# What a search prints of its rate: "150 cases explored in 30s (5.03 cases/s), ..."
SEARCH_RATE = re.compile(r"cases explored in \S+ \(([0-9.]+) cases/s\)")
COMMAND_TIMEOUT_S = 1800
QUIET_TIMEOUT_S = 60.0


@dataclass
class Tree:
    """A harness source tree and how to run it."""

    label: str
    root: Path
    env: dict = field(default_factory=dict)

    def command(self, args: list[str], store: Path) -> list[str]:
        return [sys.executable, "-m", "harness", *[a.replace("{store}", str(store)) for a in args]]


def figure_args(name: str) -> list[str]:
    """The command line of a figure (``{store}`` stands for a fresh store folder)."""
    run = ["run", "--device", "cpu", "--store", "{store}", "--no-diagnose"]
    if name == "startup":
        return ["list", "impls"]
    if name == "check-one":
        return ["check", "--impl", "torch", "--case", ONE_CASE, "--device", "cpu"]
    if name == "run-one":
        return [*run, "--impl", "torch", "--case", ONE_CASE]
    if name == "layer":
        return [*run, "--impl", "torch", *[a for f in LAYER_FAMILIES for a in ("--case", f"{f}/*")]]
    if name in ("ddp", "compile"):
        return [*run, "--impl", "torch", "--case", f"{name}/*"]
    if name == "default":
        return [*run, "--impl", "torch"]
    if name == "search":
        return ["search", "--impl", "reference", "--device", "cpu", "--max-cases", str(SEARCH_CASES), "--seed", "0",
                "--store", "{store}", "--out", "{store}/search-out"]
    if name == "search-fail":
        return ["search", "--impl", f"{FAILING_PLUGIN[0]}:RaisesOnEveryRank", "--device", "cpu", "--max-cases",
                str(SEARCH_FAIL_CASES), "--seed", "0", "--store", "{store}", "--out", "{store}/search-out"]
    if name.startswith("impls-"):
        n = int(name.split("-", 1)[1])
        return [*run, *[a for i in SCALING_IMPLS[:n] for a in ("--impl", i)],
                *[a for c in SCALING_CASES for a in ("--case", c)]]
    raise UsageError(f"unknown figure {name!r}: choose among {', '.join(FIGURES)}")


def repository_root(start: Path) -> Path:
    """The git work tree holding ``start`` (the baseline is one of its commits)."""
    proc = subprocess.run(["git", "-C", str(start), "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                          timeout=60)
    if proc.returncode != 0:
        raise UsageError(f"--baseline needs this harness to run from a git checkout; {start} is not in one "
                         f"({proc.stderr.strip()})")
    return Path(proc.stdout.strip())


def export_baseline(repo: Path, ref: str, into: Path) -> Tree:
    """``ref`` of ``repo`` as a runnable tree under ``into`` (see the module docstring)."""
    proc = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--short=12", f"{ref}^{{commit}}"],
                          capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise UsageError(f"--baseline {ref!r} is not a commit of {repo}: {proc.stderr.strip()}")
    commit = proc.stdout.strip()
    root = into / f"baseline-{commit}"
    root.mkdir(parents=True)
    archive = subprocess.Popen(["git", "-C", str(repo), "archive", commit], stdout=subprocess.PIPE)
    try:
        subprocess.run(["tar", "-x", "-C", str(root)], stdin=archive.stdout, check=True, timeout=600)
    finally:
        archive.stdout.close()
        archive.wait(timeout=600)
    for name in ("cases", "kernels"):
        if (root / name).is_dir() and not (root / "harness" / name).exists():
            (root / "harness" / name).symlink_to(root / name, target_is_directory=True)
    return Tree(f"baseline {commit}", root, python_path(root))


# The checkout this module is in: what ``this tree`` runs (its ``harness`` package is ``ROOT / "harness"``).
ROOT = Path(__file__).resolve().parents[2]


def python_path(root: Path) -> dict:
    """``PYTHONPATH`` for a tree: its root (its ``harness`` first) and its test plugins."""
    parts = [str(root), str(root / "tests" / "support"), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in parts if p)}


def time_command(tree: Tree, args: list[str], scratch: Path) -> tuple[float, Optional[float]]:
    """Wall seconds of one run of ``args`` in ``tree`` (exit 0 or 1: a finding is not a failure of the bench), and
    the rate a search reports (None for other commands)."""
    store = Path(tempfile.mkdtemp(prefix="store-", dir=scratch))
    cmd = tree.command(args, store)
    done = procs.run_group(cmd, timeout=COMMAND_TIMEOUT_S, cwd=scratch, env={**os.environ, **tree.env})
    if done.timed_out:
        raise RuntimeError(f"{tree.label}: `{' '.join(cmd)}` took more than {COMMAND_TIMEOUT_S}s")
    elapsed, stdout, stderr = done.wall_s, done.out, done.err
    await_quiet(done.pid)
    shutil.rmtree(store, ignore_errors=True)
    # Exit 1 is a finding, not a failure of the bench; a traceback is (Python exits 1 on an uncaught exception).
    if done.code not in (0, 1) or "Traceback (most recent call last)" in (stderr or ""):
        tail = "\n".join((stderr or stdout).strip().splitlines()[-15:])
        raise RuntimeError(f"{tree.label}: `{' '.join(cmd)}` exited {done.code}:\n{tail}")
    rate = SEARCH_RATE.search(stdout or "") if args[0] == "search" else None
    return elapsed, float(rate.group(1)) if rate else None


def await_quiet(session: int, timeout: float = QUIET_TIMEOUT_S) -> None:
    """Wait (untimed) until no process of ``session`` is still running: what a command leaves running after it
    exits (a forkserver's teardown, say) must not slow the next command timed. Linux only (reads /proc);
    after ``timeout`` seconds the stragglers are killed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not procs.in_session(session):
            return
        time.sleep(0.01)
    for pid in procs.in_session(session):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def bench_run(baseline: Optional[str], figures: tuple[str, ...], repeat: int, warmup: bool,
              echo: Callable[[str], None] = print) -> list[dict]:
    """Time each figure in this tree and (with ``baseline``) in that commit, turn by turn; print and return."""
    here = ROOT
    scratch = Path(tempfile.mkdtemp(prefix="syncbn-bench-"))
    try:
        trees = [Tree("this tree", here, python_path(here))]
        if baseline:
            trees.insert(0, export_baseline(repository_root(here), baseline, scratch))
        plugins = scratch / "plugins"
        plugins.mkdir()
        (plugins / f"{FAILING_PLUGIN[0]}.py").write_text(FAILING_PLUGIN[1])
        for tree in trees:  # every tree imports the bench's own plugins
            tree.env["PYTHONPATH"] = os.pathsep.join([str(plugins), tree.env["PYTHONPATH"]])
        echo(f"{', '.join(t.label for t in trees)}; python {sys.version.split()[0]}; median of {repeat}; "
             f"{os.cpu_count()} CPUs")
        rows = []
        for name in figures:
            args = figure_args(name)
            if warmup:
                for tree in trees:
                    time_command(tree, args, scratch)
            times: dict[str, list[float]] = {t.label: [] for t in trees}
            rates: dict[str, list[float]] = {t.label: [] for t in trees}
            for _ in range(repeat):
                for tree in trees:
                    elapsed, rate = time_command(tree, args, scratch)
                    times[tree.label].append(elapsed)
                    if rate is not None:
                        rates[tree.label].append(rate)
            row = {"figure": name, "command": " ".join(args)}
            row.update({t.label: statistics.median(times[t.label]) for t in trees})
            if all(rates.values()):
                row["cases/s"] = {t.label: statistics.median(rates[t.label]) for t in trees}
            if baseline:
                row["ratio"] = row["this tree"] / row[trees[0].label]
            rows.append(row)
            echo(format_row(row, trees))
        if any(r["figure"].startswith("impls-") for r in rows):
            echo(scaling_summary(rows, trees))
        return rows
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def format_row(row: dict, trees: list[Tree]) -> str:
    cells = "  ".join(f"{t.label}: {row[t.label]:7.2f} s" for t in trees)
    ratio = f"  ratio {row['ratio']:.2f}x" if "ratio" in row else ""
    rates = ""
    if "cases/s" in row:
        rates = "\n" + " " * 11 + "  ".join(f"{t.label}: {row['cases/s'][t.label]:5.1f} cases/s" for t in trees)
    return f"{row['figure']:10s} {cells}{ratio}{rates}"


def scaling_summary(rows: list[dict], trees: list[Tree]) -> str:
    """How the run time grows from 1 implementation to N, per tree."""
    by = {r["figure"]: r for r in rows}
    base = by.get("impls-1")
    if base is None:
        return "(impls-1 not measured: no scaling summary)"
    lines = ["scaling with implementations (time at N / time at 1):"]
    for t in trees:
        parts = [f"N={n}: {by[f'impls-{n}'][t.label] / base[t.label]:.2f}x"
                 for n in (3, 10) if f"impls-{n}" in by]
        lines.append(f"  {t.label}: " + ", ".join(parts))
    return "\n".join(lines)
