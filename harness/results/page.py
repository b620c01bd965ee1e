"""What a report shows, gathered from the store's index in bounded memory (:func:`gather`), and the per-build
CSV exports (:func:`write_csv`).

Counts come from SQL over the index (:mod:`harness.results.index`); only the
records a page shows are read back from the store's files: the first
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

from harness.errors import UsageError
from harness.results.frames import FAILING, metrics_frame, records_frame


class EmptyStore(UsageError):
    """The store holds no records: nothing to report (exit 2, like any store or build that is not there)."""


MAX_FAILING = 200  # rows of the failing table on the page (the rest counted, and how to list them)
MAX_COMPILED = 200  # rows of the compiled cases' table
PLOT_SAMPLE = 400  # records per implementation whose tensors are plotted (the worst ones first)


@dataclass
class Page:
    """What the page and the summary show, gathered from the index in bounded memory.

    ``cells``: one row per (build, impl, family, status, known_issue) with its count ``n``; ``builds``: each
    build's key and torch_git_version; ``failing``/``compiled``: records frames of the rows shown, with the
    totals they were cut from; ``plots``: per implementation the metrics frame of a sample and its size."""

    store_dir: str
    total: int
    cells: object
    builds: object
    failing: object
    failing_total: int
    failing_known: int
    compiled: object
    compiled_total: int
    plots: dict  # impl -> (metrics frame of the sample, records sampled, records with metrics)
    modes: dict  # impl -> its modes, comma-separated


def _frame(index, where: str, params: tuple, order: str, limit: int):
    """A records frame of the latest records matching ``where``, in ``order``, at most ``limit``."""
    rows = index.query(f"SELECT file, offset, length FROM latest WHERE {where} ORDER BY {order} LIMIT ?",
                       (*params, limit))
    return records_frame(list(index.load(rows)))


def gather(store_dir) -> Page:
    """The page's data: counts by SQL over the store's index, and only the records shown read back."""
    import pandas as pd

    from harness.results.index import refreshed

    with refreshed(store_dir) as index:
        ((total,),) = index.query("SELECT count(*) FROM latest")
        if not total:
            raise EmptyStore(f"the store {store_dir} holds no records: run `syncbn-harness run --store "
                             f"{store_dir}` first, or point --store at another directory")
        cells = pd.DataFrame(index.query("SELECT build, impl, family, status, known, count(*) FROM latest "
                                         "GROUP BY build, impl, family, status, known"),
                             columns=["build", "impl", "family", "status", "known_issue", "n"])
        cells["known_issue"] = cells["known_issue"].astype(bool)
        builds = pd.DataFrame(index.query("SELECT build, max(torch_git_version) FROM latest GROUP BY build"),
                              columns=["build", "torch_git_version"])
        failing_where = f"status IN ({', '.join('?' * len(FAILING))})"
        ((failing_total, failing_known),) = index.query(
            f"SELECT count(*), coalesce(sum(known), 0) FROM latest WHERE {failing_where}", FAILING)
        failing = _frame(index, failing_where, FAILING, "known, impl, build, case_id", MAX_FAILING)
        confirmed = set(index.query(f"SELECT DISTINCT impl, case_id FROM latest WHERE mode = 'native' AND "
                                    f"{failing_where}", FAILING))
        if not failing.empty:
            failing["confirmation"] = [
                ("cpu-emulation, not yet confirmed on CUDA" if (impl, case) not in confirmed
                 else "cpu-emulation, confirmed on CUDA") if mode == "cpu-emulation" else ""
                for impl, case, mode in zip(failing["impl"], failing["case"], failing["mode"])]
            failing = failing.sort_values(["known_issue", "severity_rank"], kind="stable")
        ((compiled_total,),) = index.query("SELECT count(*) FROM latest WHERE compiled = 1")
        compiled = _frame(index, "compiled = 1", (), "impl, build, case_id", MAX_COMPILED)
        plots = {}
        for (impl,) in index.query("SELECT DISTINCT impl FROM latest ORDER BY impl"):
            rows = index.query("SELECT file, offset, length FROM latest WHERE impl = ? AND has_metrics = 1 "
                               "ORDER BY coalesce(worst_ratio, 0) > 1 DESC, (id * 2654435761) % 1000003 LIMIT ?",
                               (impl, PLOT_SAMPLE))
            ((with_metrics,),) = index.query("SELECT count(*) FROM latest WHERE impl = ? AND has_metrics = 1",
                                             (impl,))
            plots[impl] = (metrics_frame(list(index.load(rows))), len(rows), with_metrics)
        modes = dict(index.query("SELECT impl, group_concat(DISTINCT mode) FROM latest GROUP BY impl"))
    return Page(str(store_dir), total, cells, builds, failing, failing_total, failing_known, compiled,
                compiled_total, plots, modes)


def write_csv(store_dir, out: Path) -> list[Path]:
    """Per build, its latest records (one row each) and their compared tensors: one build in memory at a time."""
    from harness.results.index import refreshed

    out.mkdir(parents=True, exist_ok=True)
    written = []
    with refreshed(store_dir) as index:
        for (build,) in index.query("SELECT DISTINCT build FROM latest ORDER BY build"):
            rows = index.query("SELECT file, offset, length FROM latest WHERE build = ? ORDER BY id", (build,))
            records = list(index.load(rows))
            for kind, frame in (("records", records_frame(records)), ("metrics", metrics_frame(records))):
                path = out / f"{build}.{kind}.csv"
                frame.to_csv(path, index=False, errors="backslashreplace")
                written.append(path)
    return written
