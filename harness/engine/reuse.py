"""Whether a warm pool can take the next task after one that failed (pure: decided from the observations).

A pool is torn down after a failure because a rank left inside a collective,
or with half a message in its transport, cannot take another task: the next
task's collectives would meet the old one's. Restarting costs seconds (new
processes, a new process group), which is most of a case's time when an
implementation fails often, as the ones worth searching do. So a failure
keeps the pool when the observations prove nothing is left in flight:

1. every rank answered (none died, none was silent past the timeout);
2. every rank ended ``pass``, ``mismatch`` or ``error`` (an exception its
   own code raised and the rank caught): no crash, hang or peer failure;
3. no rank's exception was raised inside ``torch.distributed`` (a collective
   that failed half-way may leave bytes in its transport);
4. the collective fingerprints agree: within each process group, every
   member issued the same collectives in the same order (op, group, dtype,
   element count), so each one was matched on every rank and completed
   (a rank returns from a gloo collective only once its peers took part);
5. every collective went through the recorder: the layer and inference
   scenarios without ``torch.compile`` (the implementation's own collectives
   only; DDP's reducer and a compiled graph talk below it, unrecorded, so no
   fingerprint can prove them finished).

A pool without a process group (``Case.backend == "no-group"``) has no
transport to leave anything in: rules 1 and 2 suffice there.

A task that passes these checks leaves every rank at the top of its loop,
with the same process groups as a fresh pool and nothing pending; a test
runs a failing case and then a passing one on the same pool and compares the
second record with a fresh pool's.
"""

from __future__ import annotations

from typing import Iterable, Optional

from harness.catalog.case import NO_GROUP
from harness.judge.call import read_calls
from harness.judge.status import RankStatus

REUSABLE_STATUSES = frozenset({RankStatus.PASS, RankStatus.MISMATCH, RankStatus.ERROR})
RECORDED_SCENARIOS = ("layer", "inference")  # whose every collective is the implementation's own, recorded


def fingerprints(collectives: Optional[list]) -> Optional[dict[tuple, list[tuple]]]:
    """One rank's collectives (stored form) per group (its member ranks): each call's signature (op, dtype,
    numel) in order; None if unknown."""
    calls = read_calls(collectives)
    if calls is None:
        return None
    out: dict[tuple, list[tuple]] = {}
    for call in calls:
        out.setdefault(call.group, []).append(call.signature())
    return out


def groups_agree(per_rank: dict[int, Optional[list]]) -> bool:
    """Whether, in every group any rank used, every member issued the same collectives in the same order.

    A call whose group is empty names the default group: every rank of the world.
    """
    prints = {r: fingerprints(c) for r, c in per_rank.items()}
    if any(p is None for p in prints.values()):
        return False
    world = tuple(sorted(per_rank))
    groups = {g for p in prints.values() for g in p}
    for group in groups:
        members = group or world
        if any(m not in prints for m in members):
            return False
        seqs = [prints[m].get(group, []) for m in members]
        if any(s != seqs[0] for s in seqs[1:]):
            return False
    return True


def raised_in_collective(traceback: Optional[str]) -> bool:
    """Whether an exception's traceback passes through torch.distributed (raised inside a collective)."""
    return bool(traceback) and ("torch/distributed/" in traceback or "torch\\distributed\\" in traceback)


def reusable(case: dict, observations: Iterable, statuses: Iterable[RankStatus]) -> bool:
    """Whether the pool that ran ``case`` (a task's case dict) can run the next task (see the module docstring)."""
    obs = list(observations)
    if case.get("scenario", "layer") not in RECORDED_SCENARIOS or case.get("compile"):
        return False
    if any(o.result is None or o.died for o in obs):
        return False
    if any(s not in REUSABLE_STATUSES for s in statuses):
        return False
    if case.get("backend") == NO_GROUP:
        return True
    if any(o.result.status is RankStatus.ERROR and raised_in_collective(o.result.traceback) for o in obs):
        return False
    return groups_agree({o.rank: o.result.collectives for o in obs})
