"""The one path from what the ranks did to a :class:`~harness.results.records.Record`.

Used by the local pool (:mod:`harness.engine.session`) and by torchrun
(:mod:`harness.engine.torchrun`) alike. The status and message are the
verdict's (:func:`harness.judge.verdict.case_verdict`, given what
``nn.BatchNorm`` refuses and the scenario's checks across ranks); this module
only gathers the rest: the case's parameters, the build's identity, every
rank's outcome and metrics (prefixed ``rank<r>.``), how the implementation ran
(its mode and notes), the first desync, what torch.compile did on each rank,
and what the known-issues file says of it.
"""

from __future__ import annotations

import datetime
from functools import lru_cache
from typing import Optional

from harness.buildinfo import BuildInfo
from harness.engine.attribution import message as attribution_message
from harness.judge import plain_layer
from harness.judge.metric_key import MetricKey
from harness.judge.status import RankStatus, Status
from harness.judge.verdict import case_verdict
from harness.results.known_issues import annotate
from harness.results.records import Record


def now() -> str:
    """UTC, to the second, ISO 8601."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def record(case, impl, info: BuildInfo, device: str, backend: str, status: Status, message: str, **fields) -> Record:
    """A record of ``(case, impl)`` on this build, annotated with the known-issues file."""
    version = fields.pop("impl_version", None) or _safe_version(impl)
    rec = Record(case=case.id, family=case.family, params=case.params(), impl=impl.name, status=status,
                 message=message, impl_version=version, mode=fields.pop("mode", None) or impl.mode_on(device),
                 torch_version=info.torch_version, torch_git_version=info.torch_git_version, overlay=info.overlay,
                 cuda_version=info.cuda_version, device=device, backend=backend, world_size=case.world_size,
                 host=info.host, started_at=fields.pop("started_at", None) or now(), **fields)
    return annotate(rec)


def not_run(case, impl, info: BuildInfo, device: str, backend: str, status: Status, reason: str) -> Record:
    """A ``skipped`` or ``unsupported`` record, with the reason."""
    return record(case, impl, info, device, backend, status, reason)


@lru_cache(maxsize=8192)
def ranked(name: str, rank: int) -> str:
    """A rank's metric name as the record files it (``rank<r>.`` in front; the names repeat from case to case)."""
    return str(MetricKey.parse(name).on_rank(rank))


def from_outcome(case, impl, info: BuildInfo, device: str, backend: str, outcome, started: str,
                 duration: float) -> Record:
    """The record of a task every rank took part in (``outcome``: a pool's or torchrun's TaskOutcome)."""
    from harness.scenarios import module as scenario

    results = [r for r in outcome.results if r is not None]
    metrics = {ranked(name, res.rank): m for res in results for name, m in res.metrics.items()}
    verdict = case_verdict(
        outcome.status, outcome.ranks, attribution_message(outcome.ranks),
        finished=[r.rank for r in results if r.status in (RankStatus.PASS, RankStatus.MISMATCH)],
        layer=plain_layer.refusal(case, device) if outcome.status is Status.ERROR else None,
        across=lambda: scenario(case.scenario).judge_across(case, results))
    first = results[0] if results else None
    return record(case, impl, info, device, backend, verdict.status, verdict.message, ranks=outcome.ranks,
                  metrics={**metrics, **verdict.metrics}, duration_s=round(duration, 4), started_at=started,
                  impl_version=first.impl_version if first else None, mode=first.mode if first else None,
                  mode_notes=tuple(first.mode_notes) if first else (), compare=merge_compare(results),
                  desync=verdict.desync.to_dict() if verdict.desync else None, compile=merge_compile(results),
                  logs=getattr(outcome, "logs", None))


def merge_compare(results: list) -> Optional[dict]:
    """The ranks' implementation-vs-implementation differences: the largest per tensor over ranks."""
    parts = [r.compare for r in results if r.compare]
    if not parts:
        return None
    merged = {"with": parts[0]["with"], "max_abs_diff": {}, "error": next((p["error"] for p in parts if p["error"]),
                                                                          None)}
    for p in parts:
        for name, v in p["max_abs_diff"].items():
            merged["max_abs_diff"][name] = max(v, merged["max_abs_diff"].get(name, 0.0))
    return merged


def merge_compile(results: list) -> Optional[dict]:
    """The ranks' torch.compile metrics (harness.engine.compiled): the options once, then each rank's own."""
    parts = {r.rank: r.compile for r in results if r.compile}
    if not parts:
        return None
    first = next(iter(parts.values()))
    spec = {k: first[k] for k in ("backend", "fullgraph", "dynamic") if k in first}
    return {**spec, "ranks": {str(rank): {k: v for k, v in c.items() if k not in spec}
                              for rank, c in sorted(parts.items())}}


def _safe_version(impl) -> Optional[str]:
    try:
        return impl.version()
    except Exception:  # noqa: BLE001 - an unreadable version is not a failure of the case
        return None
