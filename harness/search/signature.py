"""How a record fails, in a few words: a finding's symptoms, and the key known findings are tallied by.

A finding is a cause (:mod:`harness.search.cause`); the signatures of the
failures it explains are its symptoms, listed under it. Known issues are
tallied by signature, as the known-issues file names them. A signature is
the implementation, the status and the evidence:
- ``mismatch``: the first failing tensor, named without its step and rank
  (``train.output``, ``eval.running_var``, ``train.running_mean.across_ranks``,
  ``collectives.eval``), so that a shrunk case with fewer steps or ranks can
  still fail the same way, and what is wrong with it when it is not a
  number out of tolerance (``train.output: dtype``, ``: non-finite``,
  ``: layout``, ``: shape``): a wrong dtype and a NaN are two findings;
- ``error``: the exception type of the first rank that raised;
- ``crash``: the signal (or exit code) of the first rank that died;
- ``hang``: ``timeout``;
and, when the ranks issued different collectives, the first divergence's
operation (``desync all_gather``), which names the cause ahead of its
consequences.
"""

from __future__ import annotations

from typing import Optional

from harness.judge.metric_key import MetricKey
from harness.judge.status import RankStatus, Status
from harness.results.records import Record


def tensor_kind(metric_name: str) -> str:
    """``rank1.step2.train.running_var`` -> ``train.running_var``; ``convert.3`` -> ``convert``."""
    return MetricKey.parse(metric_name).kind


def failure_words(record: Record) -> str:
    """What failed (see the module docstring)."""
    parts = []
    if record.desync:
        calls = record.desync_calls()
        parts.append(f"desync {calls[0].op if calls else 'missing collective'}")
    if record.status == Status.MISMATCH:
        first = record.first_failure()
        if first is not None:
            kind = record.metrics[first].kind
            parts.append(tensor_kind(first) + (f": {kind.value}" if kind else ""))
    elif record.status == Status.ERROR:
        rank = record.first_rank(RankStatus.ERROR)
        parts.append(rank.exception_type or "error" if rank else "error")
    elif record.status == Status.CRASH:
        rank = record.first_rank(RankStatus.CRASH)
        parts.append((rank.signal or f"exit {rank.exit_code}") if rank else "crash")
    elif record.status == Status.HANG:
        parts.append("timeout")
    return ", ".join(parts) or record.status.value


def signature(record: Record) -> Optional[str]:
    """``impl: status (failure words)`` for a failure (known or not), None for anything else."""
    if record.status not in (Status.MISMATCH, Status.ERROR, Status.CRASH, Status.HANG):
        return None
    return f"{record.impl}: {record.status.value} ({failure_words(record)})"
