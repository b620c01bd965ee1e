"""The one path from what the ranks did to a :class:`~harness.results.records.Record`.

Used by the local pool (:mod:`harness.engine.session`) and by torchrun
(:mod:`harness.engine.torchrun`) alike. A record gets the case's parameters,
the build's identity, every rank's outcome, every rank's metrics (prefixed
``rank<r>.``), the first collective the ranks disagreed on
(:func:`harness.judge.desync.first_divergence`: named first in the message,
ahead of the crash or hang it causes, and a mismatch where nothing else
failed), the checks across ranks of the case's scenario (a rank-level pass
can still be a case-level mismatch there), what torch.compile did on each
rank (compiled cases), and what the known-issues file says of it. An error that
``nn.BatchNorm`` raises too on the same dtypes is ``unsupported``
(:mod:`harness.engine.plain_layer`).
"""

from __future__ import annotations

import datetime
from functools import lru_cache
from typing import Optional

from harness.buildinfo import BuildInfo
from harness.engine.attribution import message as attribution_message
from harness.judge.desync import first_divergence
from harness.judge.metric_key import MetricKey
from harness.engine.plain_layer import refused_like_the_layer
from harness.results.known_issues import annotate
from harness.results.records import RankStatus, Record, Status


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
    status = outcome.status
    text = attribution_message(outcome.ranks)
    if status == Status.ERROR:
        said = refused_like_the_layer(case, device, outcome.ranks)
        if said:
            # What nn.BatchNorm raises too is documented behaviour: the other ranks' failures, if any, remain.
            others = {o.status for o in outcome.ranks if o.status is not RankStatus.ERROR}
            status = Status.MISMATCH if RankStatus.MISMATCH in others else Status.UNSUPPORTED
            layer = f"nn.BatchNorm on {device} refuses {case.dtype} input with {case.param_dtype} parameters too " \
                    f"({said})"
            text = f"{text}; {layer}" if status == Status.MISMATCH else f"{layer}: the SyncBN raises what it replaces"
    desync = first_divergence({o.rank: o.collectives for o in outcome.ranks},
                              [r.rank for r in results if r.status in (RankStatus.PASS, RankStatus.MISMATCH)])
    if desync is not None:
        # The cause goes first: the crash, hang or wrong numbers that follow are its consequences.
        text = "; ".join(filter(None, [f"desync: {desync.message}", text]))
        if status == Status.PASS:
            status = Status.MISMATCH
    if status in (Status.PASS, Status.MISMATCH):
        bad = []
        for name, m in scenario(case.scenario).judge_across(case, results):
            metrics[name] = m
            if not m.ok:
                bad.append(f"{name}: {m.describe()}")
        if bad:
            status = Status.MISMATCH
            text = "; ".join(filter(None, [text, *bad[:3]]))
    first = results[0] if results else None
    return record(case, impl, info, device, backend, status, text, ranks=outcome.ranks, metrics=metrics,
                  duration_s=round(duration, 4), started_at=started,
                  impl_version=first.impl_version if first else None, mode=first.mode if first else None,
                  compare=merge_compare(results), desync=desync.to_dict() if desync else None,
                  compile=merge_compile(results), logs=getattr(outcome, "logs", None))


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
