"""The verdict's words: a case's :class:`Status`, one rank's :class:`RankStatus` and :class:`RankOutcome`.

Design note. These are the judge's vocabulary, so they live below everything
that speaks it: the rules that set a status (:mod:`harness.judge.verdict`),
the engine that observes ranks, the records that store the result and the
reports that show it all import them from here. Plain data, no torch.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, fields
from typing import Optional


class Status(str, enum.Enum):
    """Outcome of one (case, impl); :data:`FAILURES` make ``run`` exit 1 unless they are known issues."""

    PASS = "pass"
    MISMATCH = "mismatch"
    ERROR = "error"
    CRASH = "crash"
    HANG = "hang"
    UNSUPPORTED = "unsupported"
    SKIPPED = "skipped"

    def __str__(self) -> str:
        return self.value


FAILURES = frozenset({Status.MISMATCH, Status.ERROR, Status.CRASH, Status.HANG})
# Nothing ran: the implementation cannot run the case here, or says it does not support it.
NOT_RUN = frozenset({Status.SKIPPED, Status.UNSUPPORTED})
# Every status, worst first: the order reports and tables sort and color by.
WORST_FIRST = (Status.CRASH, Status.HANG, Status.ERROR, Status.MISMATCH, Status.PASS, Status.UNSUPPORTED,
               Status.SKIPPED)


class RankStatus(str, enum.Enum):
    """What one rank did during a case. ``PEER_FAILED``: stopped because a sibling failed, not blamed."""

    PASS = "pass"
    MISMATCH = "mismatch"
    ERROR = "error"
    CRASH = "crash"
    HANG = "hang"
    PEER_FAILED = "peer-failed"

    def __str__(self) -> str:
        return self.value


@dataclass
class RankOutcome:
    """What one rank did during a case: its status and the evidence (exception, signal, stack dump)."""

    rank: int
    status: RankStatus
    exit_code: Optional[int] = None
    signal: Optional[str] = None  # e.g. "SIGSEGV"
    exception_type: Optional[str] = None
    message: str = ""
    traceback: Optional[str] = None
    stack_dump: Optional[str] = None  # faulthandler dump of a hung or crashed rank
    collectives: Optional[list] = None  # the collectives this rank issued, in order (plain dicts)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["status"] = self.status.value
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "RankOutcome":
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["status"] = RankStatus(kw["status"])
        return cls(**kw)

    def line(self) -> str:
        """``rank 1: crash SIGSEGV exited ...``: one line for JUnit details and terminals."""
        return f"rank {self.rank}: {self.status.value} {self.exception_type or ''} {self.message}".strip()
