"""Records as pandas frames: one row per record, and one row per compared tensor (CSV exports, plots, tables).

Protocol: both take a sequence of :class:`~harness.results.records.Record`
already chosen by the caller (the report reads back only the records it shows,
or one build at a time for CSV), so memory follows what the caller chose.
"""

from __future__ import annotations

import json
from typing import Iterable

from harness.results import compile_stats, fingerprint
from harness.judge.status import FAILURES, WORST_FIRST, RankStatus
from harness.results.records import Record
from harness.results.severity import Severity, assess
from harness.results.store import record_key

FAILING = tuple(s.value for s in WORST_FIRST if s in FAILURES)  # the failing statuses, worst first


def attribution(record: Record) -> str:
    """Which ranks failed and how: ``rank 1: crash SIGSEGV; rank 0: peer-failed``."""
    parts = []
    for o in record.ranks:
        if o.status is RankStatus.PASS:
            continue
        if o.status is RankStatus.PEER_FAILED:
            parts.append(f"rank {o.rank}: {o.status.value}")
            continue
        how = o.signal or o.exception_type or (f"exit {o.exit_code}" if o.exit_code not in (None, 0) else "")
        parts.append(f"rank {o.rank}: {o.status.value}" + (f" {how}" if how else ""))
    return "; ".join(parts)


def records_frame(records: Iterable[Record]):
    """One row per record: build, impl, case, family, status, worst err/tol, attribution, params..."""
    import pandas as pd

    rows = []
    for r in records:
        a = assess(r)
        row = {"build": record_key(r), "torch_version": r.torch_version, "torch_git_version": r.torch_git_version,
               "device": r.device, "backend": r.backend, "impl": r.impl, "impl_version": r.impl_version,
               "mode": r.mode_text, "emulated": r.emulated, "case": r.case, "family": r.family,
               "status": r.status.value, "known_issue": r.known,
               "known_link": r.known_issue.link if r.known_issue else "",
               "worst_ratio": r.worst_ratio, "message": r.message, "ranks": attribution(r),
               "collectives": "\n".join(fingerprint.per_rank(r)) if r.status.value in FAILING else "",
               "desync": r.desync_message,
               "diagnosis": r.diagnosis_summary,
               "world_size": r.world_size, "duration_s": r.duration_s, "started_at": r.started_at, "host": r.host,
               "severity": a.summary() if a else "", "severity_rank": a.rank if a else len(Severity),
               "in_training": a.notice() if a else "", **compile_stats.columns(r)}
        for k, v in sorted(r.params.items()):
            row[f"param.{k}"] = json.dumps(v) if isinstance(v, (list, dict)) else v
        rows.append(row)
    return pd.DataFrame(rows)


def metrics_frame(records: Iterable[Record]):
    """One row per compared tensor: build, impl, case, metric name, tensor, max_abs_err, tol, ratio, ok."""
    import pandas as pd

    rows = []
    for r in records:
        for name, m in r.metrics.items():
            rows.append({"build": record_key(r), "impl": r.impl, "case": r.case, "status": r.status.value,
                         "metric": name, "tensor": name.rsplit(".", 1)[-1], "max_abs_err": m.max_abs_err,
                         "max_rel_err": m.max_rel_err, "tol": m.tol, "ratio": m.ratio, "ok": m.ok,
                         "problem": m.problem})
    frame = pd.DataFrame(rows, columns=["build", "impl", "case", "status", "metric", "tensor", "max_abs_err",
                                        "max_rel_err", "tol", "ratio", "ok", "problem"])
    # Numbers even when no record compared anything (a store of skipped records): an empty column is untyped.
    return frame.astype({"max_abs_err": float, "max_rel_err": float, "tol": float, "ratio": float})
