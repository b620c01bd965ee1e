"""A record's collective fingerprint: what each rank said, compactly, and how it changed between builds.

Each rank of a record carries its collectives in order (``ranks[i].collectives``,
in their stored form, read as :class:`~harness.judge.call.Call`). Two views of them:

- :func:`compact`: one line per rank for people, per step, consecutive
  repeats counted: ``step 0: all_gather float32[11], all_reduce float32[10] x2``
  (a subgroup is shown after ``@``);
- :func:`pattern`: per rank, the tuple that must not change silently between
  builds: ``(op, group, dtype, numel)`` of each call. :func:`change` compares
  two records' patterns (count, op, dtype, size, group) and says where they
  first differ; ``diff`` and ``gate`` report that as its own kind of change.
  A rank stopped mid-case (a crash, a hang, a sibling's failure) is compared
  over the calls both sides reached only: how far it got is timing.

A side without fingerprints (records written before the harness recorded
them) is never a change: nothing is known to compare.
"""

from __future__ import annotations

from itertools import groupby
from typing import Optional

from harness.judge.call import Call, read_calls
from harness.judge.status import RankStatus
from harness.results.records import Record


def _call(c: Call, world: tuple[int, ...]) -> str:
    group = f" @[{','.join(map(str, c.group))}]" if c.group and c.group != world else ""
    return c.describe() + group


def compact(stored: Optional[list[dict]], world_size: int) -> str:
    """``step 0: all_gather float32[11], all_reduce float32[10] x2 | step 1: ...``; ``-`` for none, ``?`` unknown."""
    calls = read_calls(stored)
    if calls is None:
        return "?"
    if not calls:
        return "-"
    world = tuple(range(world_size))
    parts = []
    for step, in_step in groupby(calls, key=lambda c: c.step):
        names = [_call(c, world) for c in in_step]
        runs = [f"{name} x{n}" if n > 1 else name for name, n in ((k, len(list(g))) for k, g in groupby(names))]
        parts.append((f"step {step}: " if step is not None else "") + ", ".join(runs))
    return " | ".join(parts)


def per_rank(record: Record) -> list[str]:
    """``rank 0: step 0: all_gather ...`` for every rank of the record."""
    return [f"rank {o.rank}: {compact(o.collectives, record.world_size)}" for o in record.ranks]


def pattern(record: Record) -> Optional[dict[int, list[tuple]]]:
    """Per rank, ``(op, group, dtype, numel)`` of each call; None when no rank's collectives are known."""
    if not record.ranks or all(o.collectives is None for o in record.ranks):
        return None
    return {o.rank: [(c.op, c.group, c.dtype, c.numel) for c in read_calls(o.collectives)]
            for o in record.ranks if o.collectives is not None}


def _cut_short(record: Record) -> set[int]:
    """Ranks stopped mid-case (crashed, hung, or stopped because a sibling failed)."""
    return {o.rank for o in record.ranks if o.status in (RankStatus.CRASH, RankStatus.HANG, RankStatus.PEER_FAILED)}


def _describe(t: tuple) -> str:
    op, group, dtype, numel = t
    return f"{op} {dtype}[{numel}]" + (f" @{list(group)}" if group else "") if dtype else f"{op}"


def change(before: Record, after: Record) -> Optional[str]:
    """Where the two records' collectives first differ (``rank 0: 2 -> 3 collectives; #1 ...``), or None."""
    a, b = pattern(before), pattern(after)
    if a is None or b is None:
        return None
    cut = _cut_short(before) | _cut_short(after)
    for rank in sorted(set(a) & set(b)):
        x, y = a[rank], b[rank]
        if rank in cut:  # how far a rank got before it was stopped is a matter of timing: compare what both reached
            x, y = x[:min(len(x), len(y))], y[:min(len(x), len(y))]
        if x == y:
            continue
        parts = [f"rank {rank}: {len(x)} -> {len(y)} collectives"] if len(x) != len(y) else [f"rank {rank}:"]
        i = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
        old = _describe(x[i]) if i < len(x) else "none"
        new = _describe(y[i]) if i < len(y) else "none"
        parts.append(f"#{i} {old} -> {new}")
        return " ".join(parts) if parts[0].endswith(":") else "; ".join(parts)
    return None
