"""Checks on what the ranks said to each other: the collectives each issued, in order.

Each rank's collectives come from :mod:`harness.engine.collectives` in their
stored form and are read as :class:`~harness.judge.call.Call`. Three rules
hold for every SyncBN, whatever its implementation:

- **eval is silent** (:func:`eval_checks`, on each rank): a step that
  normalizes with the running statistics issues no collective;
- **a group's collectives stay in the group** (:func:`group_checks`, on each
  rank): in a case with process subgroups, a rank issues no collective over
  ranks outside its own group (an implementation that ignores its
  ``process_group`` in one of its collectives), and a rank alone in its group
  issues none at all: there is nothing to synchronize;
- **every rank of a group says the same thing** (:func:`first_divergence`, in
  the parent): the i-th collective a rank issues over a group has the same
  :meth:`~harness.judge.call.Call.signature` (op, dtype and element count) on
  every rank of that group. The first place where
  that fails is the cause of what follows (a crash in the transport, a hang, a
  wrong result) and is named with both sides: ``rank 0 all_gather
  float16[11] vs rank 1 float32[11]``. A rank whose list simply stops (it
  crashed or raised first) explains its own silence; a rank that *finished*
  the case without a collective its peers issued skipped it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

from harness.catalog.case import STEP_KINDS
from harness.judge.call import Call, read_calls
from harness.judge.metric import Metric
from harness.judge.metric_key import step_key


def describe(call: Optional[Call], *, op: bool = True) -> str:
    """``all_gather float16[11]``; ``float16[11]`` without the op; ``nothing`` for a missing call."""
    return "nothing" if call is None else call.describe(op=op)


def eval_checks(case, stored: list[dict]) -> list[tuple[str, Metric]]:
    """A failure per eval step that issued a collective (a rank's own calls, in their stored form)."""
    calls = read_calls(stored)
    out = []
    for s, kind in enumerate(case.steps):
        if STEP_KINDS[kind] != "eval":
            continue
        mine = [c for c in calls if c.step == s]
        if mine:
            out.append((step_key(s, "eval", "collectives"), Metric.failure(
                f"eval issued {len(mine)} collective(s), first {describe(mine[0])} over ranks {list(mine[0].group)}: "
                "evaluation uses the running statistics and must not synchronize (validation on one rank would "
                "hang)")))
    return out


def group_checks(case, rank: int, stored: list[dict]) -> list[tuple[str, Metric]]:
    """A failure for the first collective over ranks outside this rank's group (cases with subgroups)."""
    if not case.groups:
        return []
    calls = read_calls(stored)
    mine = next((sorted(g) for g in case.groups if rank in g), None)
    if mine is not None and len(mine) == 1 and calls:
        c = calls[0]
        return [("collectives.group", Metric.failure(
            f"rank {rank} is alone in its group and still issued {len(calls)} collective(s), first {describe(c)} "
            f"over ranks {list(c.group)} (step {c.step}): a group of one process has nothing to "
            "synchronize"))]
    for i, c in enumerate(calls):
        if c.group and list(c.group) != mine:
            return [("collectives.group", Metric.failure(
                f"collective {i} ({describe(c)}, step {c.step}) went over ranks {list(c.group)}, not the "
                f"case's group {mine}: the implementation ignored its process_group there"))]
    return []


@dataclass
class Divergence:
    """The first collective on which the ranks of a group disagree."""

    group: list[int]
    index: int  # position among the group's collectives
    calls: dict[int, Optional[Call]]  # rank -> its call there (None: it issued none)
    message: str

    def to_dict(self) -> dict:
        return {"group": self.group, "index": self.index, "message": self.message,
                "calls": {str(r): c.to_dict() if c is not None else None for r, c in self.calls.items()}}


def first_divergence(collectives: dict[int, Optional[list]], finished: Iterable[int]) -> Optional[Divergence]:
    """The earliest collective on which the ranks of a group disagree, or None.

    ``collectives``: each rank's calls (None: unknown, such a rank is left out); ``finished``: the ranks that
    completed the case (a missing call counts against them only: the others stopped early for their own reason).
    """
    finished = set(finished)
    known = {r: read_calls(stored) for r, stored in collectives.items() if stored is not None}
    groups = sorted({c.group for calls in known.values() for c in calls if c.group})
    found: Optional[Divergence] = None
    for group in groups:
        ranks = [r for r in group if r in known]
        if len(ranks) < 2:
            continue
        seqs = {r: [c for c in known[r] if c.group == group] for r in ranks}
        for i in range(max(len(s) for s in seqs.values())):
            at = {r: (s[i] if i < len(s) else None) for r, s in seqs.items()}
            issued = {r: c for r, c in at.items() if c is not None}
            skipped = [r for r, c in at.items() if c is None and r in finished]
            if len({c.signature() for c in issued.values()}) > 1 or (issued and skipped):
                if found is None or i < found.index:
                    found = Divergence(list(group), i, at, _message(list(group), i, at, skipped))
                break
    return found


def _message(group: list[int], index: int, at: dict[int, Optional[Call]], skipped: list[int]) -> str:
    issued = {r: c for r, c in at.items() if c is not None}
    first_rank, first = next(iter(sorted(issued.items())))
    other_rank = next((r for r, c in sorted(issued.items()) if c.signature() != first.signature()), None)
    step = f", step {first.step}" if first.step is not None else ""
    where = f"(collective {index} over ranks {group}{step})"
    if other_rank is not None:
        other = issued[other_rank]
        same_op = other.op == first.op
        return (f"rank {first_rank} {describe(first)} vs rank {other_rank} {describe(other, op=not same_op)} "
                f"{where}")
    return (f"rank {first_rank} {describe(first)} vs rank {skipped[0]} nothing: it finished the case without this "
            f"collective {where}")
