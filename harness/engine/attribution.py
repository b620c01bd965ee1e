"""Who is to blame: every rank's outcome of one task, from what the parent observed of it.

The same rules serve the local pool and torchrun. For each rank the caller
knows one of three things (:class:`Observation`): it answered (its
:class:`~harness.engine.messages.RankResult`), its process ended without an
answer (exit code or signal, and its log), or it stayed silent (and a
faulthandler dump of its Python stacks was taken).

- an answer is that rank's own verdict (``pass``, ``mismatch``, ``error``);
- a process that ended is a ``crash`` (signal name or exit code);
- silent ranks, when some rank failed first, are ``peer-failed``: they wait
  for the failed one (inside a collective, as their dumps show), not blamed;
- silent ranks at the timeout, with no failure first: ranks stuck outside a
  torch.distributed call are the ``hang``; the ones in a collective wait for
  them (``peer-failed``). If every silent rank is in a collective, the ranks
  that returned are the ones that skipped it (``hang``, "did not enter");
  if none returned, all are deadlocked (``hang``). The pool need not wait for
  the timeout to say so where the ranks' stacks and recorded collectives
  prove it (:func:`deadlock`);
- an exception raised inside torch.distributed after a sibling crashed is the
  sibling's doing (``peer-failed``).

The case's status from these outcomes is rule 2 of :mod:`harness.judge.verdict`.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Callable, Optional

from harness.engine.messages import RankResult
from harness.judge.call import read_calls
from harness.judge.status import RankOutcome, RankStatus, Status
from harness.judge.verdict import from_ranks

# Frames of these files in a stack or traceback mean "inside a collective".
COLLECTIVE_MARKERS = ("torch/distributed/", "distributed_c10d.py")


@dataclass
class Observation:
    """What the parent knows of one rank after a task: an answer, a death, or silence."""

    rank: int
    result: Optional[RankResult] = None
    exit_code: Optional[int] = None  # the process ended: its exit code (negative: killed by that signal)
    died: bool = False
    stack_dump: str = ""  # faulthandler dump of a silent rank, or the log tail of a dead one
    collectives: Optional[list] = None  # what a rank without an answer had issued (its sink file), if known


def signal_name(code: Optional[int]) -> Optional[str]:
    """``SIGSEGV`` for exit code -11; None for a normal exit."""
    if code is not None and code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return None


def describe_exit(code: Optional[int]) -> str:
    """``killed by SIGSEGV``, ``exited with code 3``."""
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by {signal_name(code)}"
    return f"exited with code {code}"


def in_collective(dump: str) -> bool:
    """Whether the main thread of a faulthandler dump is inside a torch.distributed call."""
    main = dump.split("Current thread", 1)[1] if "Current thread" in dump else dump
    main = main.split("\n\n", 1)[0]
    return any(m in main for m in COLLECTIVE_MARKERS)


def waits_for_good(calls: Optional[list], done: dict[int, tuple[list, bool]]) -> Optional[bool]:
    """Whether a silent rank that issued ``calls`` (its collectives this task, in order) waits in one that cannot
    complete, given the ranks that are done with the task: ``done`` maps each to (its collectives, whether it died).

    True: the group of its last collective holds a done rank that issued fewer collectives over that group, so
    that rank never issued this one and never will. None: a member of that group died after issuing as many (it
    may have died inside this very collective, or after it): only the silent rank's stack can tell. False:
    nothing says it is stuck (it issued nothing, or the done members issued this collective and lived).
    """
    mine_calls = read_calls(calls)
    if not mine_calls:
        return False
    group = mine_calls[-1].group
    mine = sum(c.group == group for c in mine_calls)
    ambiguous = False
    for rank, (theirs, died) in done.items():
        if rank not in group:
            continue
        issued = sum(c.group == group for c in read_calls(theirs) or ())
        if issued < mine:
            return True
        ambiguous = ambiguous or (died and issued == mine)
    return None if ambiguous else False


# The innermost frame of a rank blocked in a collective: torch.distributed's own code, or DDP's, which waits on
# its process group's work objects itself (its reducer, its join hook).
BLOCKED_FRAMES = ("torch/distributed/", "torch/nn/parallel/distributed.py")


def blocked_at(dump: str) -> Optional[str]:
    """The innermost frame (``File "...", line N in f``) of a faulthandler dump's main thread when it lies in
    torch.distributed or DDP (the rank waits on a collective), else None."""
    main = dump.split("Current thread", 1)[1] if "Current thread" in dump else dump
    frame = next((line.strip() for line in main.splitlines() if line.strip().startswith("File ")), None)
    return frame if frame is not None and any(m in frame for m in BLOCKED_FRAMES) else None


def deadlock(calls: dict[int, Optional[list]]) -> Optional[dict[int, str]]:
    """Where each of the ranks, all silent and blocked in collectives, waits, when they cannot be waiting for one
    and the same collective; None when they may be (their last recorded collectives agree) or a rank recorded
    none.

    The caller has seen every rank's innermost frame in torch.distributed or DDP, the same in two stack dumps,
    with no collective recorded in between: then ranks whose last collectives over their group differ (in
    operation, or in how many each issued over that group) each wait for a call the others, blocked elsewhere,
    will not make. (A collective issued without torch.distributed's Python functions, as DDP's are, is not
    recorded; the rank blocked in it has recorded fewer.)
    """
    last = {}
    for r, stored in calls.items():
        cs = read_calls(stored)
        if not cs:
            return None
        group = cs[-1].group
        last[r] = (cs[-1].op, group, sum(c.group == group for c in cs))
    for op, group, count in last.values():
        if all(m in last and last[m] == (op, group, count) for m in group):
            return None  # its group is in this one collective together: it may be slow, not stuck
    return {r: f"{op}, its collective {count} over ranks {list(group)}" for r, (op, group, count) in last.items()}


FIRST_PAUSE_S, MAX_PAUSE_S = 0.5, 4.0


class DeadlockWatch:
    """Whether the ranks of a task, all silent, are deadlocked (:func:`deadlock`), looked at again and again.

    From their recorded collectives first (a file read each), and only when those say the ranks cannot all be
    in one collective, from their stacks: a deadlock holds after two looks in a row found each rank's innermost
    frame the same blocked one in torch.distributed or DDP (:func:`blocked_at`), with the same collectives
    recorded.
    """

    def __init__(self, ranks):
        self.ranks = list(ranks)
        self.seen: Optional[tuple] = None  # (recorded collectives, innermost frames) at the last look that held
        self.dumps: dict[int, str] = {}  # the stacks of that look
        self.pause = FIRST_PAUSE_S  # how long the caller waits before the next look

    def check(self, calls_of: Callable[[int], Optional[list]],
              dump_stack: Callable[[int], str]) -> Optional[dict[int, str]]:
        """Where the ranks wait when this look and the one before prove a deadlock, else None."""
        calls = {r: calls_of(r) for r in self.ranks}
        where = deadlock(calls)
        if where is None:
            self.seen = None
            return None
        dumps = {r: dump_stack(r) for r in self.ranks}
        frames = {r: blocked_at(d) for r, d in dumps.items()}
        if not all(frames.values()) or {r: calls_of(r) for r in self.ranks} != calls:
            self.seen = None
            self.pause = min(2 * self.pause, MAX_PAUSE_S)  # a rank at work: look (and dump) less often
            return None
        held = self.seen == (calls, frames)
        self.seen, self.dumps = (calls, frames), dumps
        return where if held else None


def attribute(observations: list[Observation], *, failed_first: bool,
              timeout: float, deadlocked: Optional[dict[int, str]] = None) -> tuple[Status, list[RankOutcome]]:
    """The case's status and every rank's outcome (see the module docstring)."""
    outcomes: list[RankOutcome] = []
    silent = []
    for ob in sorted(observations, key=lambda o: o.rank):
        if ob.result is not None:
            res = ob.result
            outcomes.append(RankOutcome(rank=ob.rank, status=res.status, exception_type=res.exception_type,
                                        message=res.message, traceback=res.traceback,
                                        collectives=res.collectives))
        elif ob.died:
            outcomes.append(RankOutcome(rank=ob.rank, status=RankStatus.CRASH, exit_code=ob.exit_code,
                                        signal=signal_name(ob.exit_code), message=describe_exit(ob.exit_code),
                                        stack_dump=ob.stack_dump, collectives=ob.collectives))
        else:
            o = RankOutcome(rank=ob.rank, status=RankStatus.HANG, stack_dump=ob.stack_dump,
                            message=f"no answer within {timeout:g}s", collectives=ob.collectives)
            if failed_first or in_collective(ob.stack_dump):
                o.status = RankStatus.PEER_FAILED
                o.message = ("waiting in a collective for a rank that failed" if failed_first
                             else "waiting in a collective its peers did not enter")
            outcomes.append(o)
            silent.append(o)
    timed_out = bool(silent) and not failed_first
    if timed_out:
        _blame_hang(outcomes, silent, timeout, deadlocked)
    if any(o.status is RankStatus.CRASH for o in outcomes):
        for o in outcomes:
            if o.status is RankStatus.ERROR and o.traceback and any(m in o.traceback for m in COLLECTIVE_MARKERS):
                o.status = RankStatus.PEER_FAILED
                o.message = f"collective failed after a sibling crashed: {o.message}"
    return from_ranks(outcomes, timed_out), outcomes


def _blame_hang(outcomes: list[RankOutcome], silent: list[RankOutcome], timeout: float,
                deadlocked: Optional[dict[int, str]] = None) -> None:
    if deadlocked:  # every rank silent, each blocked where the others will never join it: ended before the timeout
        for o in silent:
            o.status = RankStatus.HANG
            o.message = f"deadlocked in {deadlocked[o.rank]}, which the others, blocked in other calls, never join"
        return
    stuck_elsewhere = [o.rank for o in silent if not in_collective(o.stack_dump or "")]
    if stuck_elsewhere:
        for o in silent:
            if o.rank in stuck_elsewhere:
                o.status, o.message = RankStatus.HANG, f"no answer within {timeout:g}s"
            else:
                o.message = f"waiting in a collective for ranks {stuck_elsewhere}"
        return
    silent_ranks = sorted(o.rank for o in silent)
    finished = [o for o in outcomes if o.rank not in silent_ranks]
    if finished:
        # Everyone still silent waits in a collective that the finished ranks never entered.
        for o in finished:
            o.status = RankStatus.HANG
            o.message = (f"returned while ranks {silent_ranks} waited {timeout:g}s in a collective this rank "
                         "did not enter")
    else:
        # All ranks are inside collectives (mismatched collectives): none can be singled out.
        for o in silent:
            o.status = RankStatus.HANG
            o.message = f"deadlocked in a collective for {timeout:g}s"


def message(outcomes: list[RankOutcome]) -> str:
    """Who did what, culprits first: ``rank 1: crash (killed by SIGSEGV); ranks [0] peer-failed``."""
    parts = []
    for o in outcomes:
        if o.status in (RankStatus.PASS, RankStatus.PEER_FAILED):
            continue
        # The first line that says something (TorchScript's messages start with a blank line).
        what = next((line.strip() for line in (o.message or "").splitlines() if line.strip()), "")
        if o.exception_type:
            what = f"{o.exception_type}: {what}"
        parts.append(f"rank {o.rank}: {o.status.value}" + (f" ({what})" if what else ""))
    peers = [o.rank for o in outcomes if o.status is RankStatus.PEER_FAILED]
    if peers:
        parts.append(f"ranks {peers} {RankStatus.PEER_FAILED.value}")
    return "; ".join(parts)[:2000]


def stacks_now() -> str:
    """Every thread's Python stack, as faulthandler writes them, with the main thread as the current one.

    The dump a rank takes of itself (torchrun's watchdog thread, when its rank is stuck) for
    :func:`in_collective` to read. A helper thread takes it, but what matters is where the main thread
    is (inside a collective or not), so the main thread is written first and labelled as faulthandler
    labels the thread it dumps from.
    """
    import sys
    import threading

    frames = sys._current_frames()
    main_id = threading.main_thread().ident
    parts = []
    for tid in [main_id] + [t for t in frames if t != main_id]:
        frame = frames.get(tid)
        if frame is None:
            continue
        label = "Current thread" if tid == main_id else "Thread"
        lines = [f"{label} 0x{tid:016x} (most recent call first):"]
        while frame is not None:
            code = frame.f_code
            lines.append(f'  File "{code.co_filename}", line {frame.f_lineno} in {code.co_name}')
            frame = frame.f_back
        parts.append("\n".join(lines))
    return "\n\n".join(parts)[:6000]
