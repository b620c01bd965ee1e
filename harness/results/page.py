"""What a report shows, gathered from the store's index in bounded memory (:func:`gather`), and the per-build
CSV exports (:func:`write_csv`).

Counts are the store's answers to named questions (:class:`~harness.results.store.Store`, served by its
index); only the records a page shows are read back from the store's files: the first
:data:`MAX_FAILING` failing records (unexpected ones first), the first
:data:`MAX_COMPILED` compiled ones, and per implementation a sample of
:data:`PLOT_SAMPLE` records whose tensors are plotted (those out of tolerance
first, then a fixed pseudo-random order). So the page's size and the memory
used do not grow with the store; the totals say what was left out.

Failing records are shown unexpected first, then worst first
(:mod:`harness.results.severity`). One seen only in cpu-emulation (torch's
Python over the harness's CPU kernels) is labelled "not yet confirmed on
CUDA" until the store holds a native record of the same case and
implementation that fails too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harness.errors import UsageError
from harness.results.frames import FAILING, metrics_frame, records_frame
from harness.results.store import Store, Where

if TYPE_CHECKING:
    import pandas as pd


class EmptyStore(UsageError):
    """The store holds no records: nothing to report (exit 2, like any store or build that is not there)."""


MAX_FAILING = 200  # rows of the failing table on the page (the rest counted, and how to list them)
MAX_COMPILED = 200  # rows of the compiled cases' table
PLOT_SAMPLE = 400  # records per implementation whose tensors are plotted (the worst ones first)


@dataclass
class Page:
    """What the page and the summary show, gathered from the store in bounded memory.

    ``cells``: one row per (build, impl, family, status, known_issue) with its count ``n``; ``builds``: each
    build's key, torch_git_version, overlaid commit (None but for an overlay) and compiled files left out;
    ``failing``/``compiled``: records frames of the rows shown, with the totals they were cut from;
    ``plots``: per implementation the metrics frame of a sample and its size."""

    store_dir: str
    total: int
    cells: "pd.DataFrame"
    builds: "pd.DataFrame"
    failing: "pd.DataFrame"
    failing_total: int
    failing_known: int
    compiled: "pd.DataFrame"
    compiled_total: int
    plots: dict[str, tuple["pd.DataFrame", int, int]]  # impl -> (metrics frame of the sample, sampled, with metrics)
    modes: dict[str, str]  # impl -> its modes, comma-separated


def gather(store_dir) -> Page:
    """The page's data: counts asked of the store, and only the records shown read back."""
    import pandas as pd

    with Store(store_dir) as store:
        total = store.count()
        if not total:
            raise EmptyStore(f"the store {store_dir} holds no records: run `syncbn-harness run --store "
                             f"{store_dir}` first, or point --store at another directory")
        cells = pd.DataFrame(store.tally(), columns=["build", "impl", "family", "status", "known_issue", "n"])
        builds = pd.DataFrame(store.build_identities(),
                              columns=["build", "torch_git_version", "overlay_commit", "left_out"])
        failing_total = store.count(Where(statuses=FAILING))
        failing_known = store.count(Where(statuses=FAILING, known=True))
        failing = records_frame(store.latest(Where(statuses=FAILING), order="failing", limit=MAX_FAILING))
        confirmed = store.pairs(Where(statuses=FAILING, native=True))
        if not failing.empty:
            failing["confirmation"] = [
                ("cpu-emulation, not yet confirmed on CUDA" if (impl, case) not in confirmed
                 else "cpu-emulation, confirmed on CUDA") if emulated else ""
                for impl, case, emulated in zip(failing["impl"], failing["case"], failing["emulated"])]
            failing = failing.sort_values(["known_issue", "severity_rank"], kind="stable")
        compiled_total = store.count(Where(compiled=True))
        compiled = records_frame(store.latest(Where(compiled=True), order="by-impl", limit=MAX_COMPILED))
        plots = {}
        for impl in store.impls():
            sample = store.sample(impl, PLOT_SAMPLE)
            plots[impl] = (metrics_frame(sample), len(sample), store.count(Where(impl=impl, has_metrics=True)))
        modes = store.modes()
    return Page(str(store_dir), total, cells, builds, failing, failing_total, failing_known, compiled,
                compiled_total, plots, modes)


def write_csv(store_dir, out: Path) -> list[Path]:
    """Per build, its latest records (one row each) and their compared tensors: one build in memory at a time."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with Store(store_dir) as store:
        for build, *_ in store.build_identities():
            records = list(store.latest(Where(build=build)))
            for kind, frame in (("records", records_frame(records)), ("metrics", metrics_frame(records))):
                path = out / f"{build}.{kind}.csv"
                frame.to_csv(path, index=False, errors="backslashreplace")
                written.append(path)
    return written
