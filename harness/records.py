"""Results as data: statuses, per-rank outcomes, records and the exit code.

A :class:`Record` is the result of one (case, implementation) on one build. It
round-trips through ``to_dict``/``from_dict`` (JSON-safe) and carries
``schema_version`` so stores can refuse newer formats and migrate older ones.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field, fields
from typing import Iterable, Optional

from harness import SCHEMA_VERSION


class Status(str, enum.Enum):
    """Outcome of one (case, impl); ``FAILURES`` make ``run`` exit 1."""

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

# Status of a rank that did not fail itself but was stopped because a sibling failed.
PEER_FAILED = "peer-failed"


@dataclass
class RankOutcome:
    """What one rank did during a case."""

    rank: int
    status: str  # a Status value, or PEER_FAILED
    exit_code: Optional[int] = None
    signal: Optional[str] = None
    exception_type: Optional[str] = None
    message: str = ""
    traceback: Optional[str] = None
    stack_dump: Optional[str] = None  # faulthandler dump of a hung rank

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "RankOutcome":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class Record:
    """One (case, impl) result on one build (SPEC §7)."""

    case: str
    family: str
    params: dict
    impl: str
    status: Status
    message: str = ""
    impl_version: Optional[str] = None
    mode: Optional[str] = None
    ranks: list[RankOutcome] = field(default_factory=list)
    metrics: dict = field(default_factory=dict)
    torch_version: str = ""
    torch_git_version: str = ""
    cuda_version: Optional[str] = None
    device: str = "cpu"
    backend: str = "gloo"
    world_size: int = 0
    duration_s: float = 0.0
    started_at: str = ""
    host: str = ""
    known_issue: Optional[dict] = None
    compare: Optional[dict] = None  # differences with another implementation on the same inputs
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict:
        d = asdict(self)
        d["status"] = self.status.value
        d["ranks"] = [r.to_dict() for r in self.ranks]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Record":
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["status"] = Status(kw["status"])
        kw["ranks"] = [RankOutcome.from_dict(r) for r in kw.get("ranks", [])]
        return cls(**kw)

    @property
    def failed(self) -> bool:
        """A failure that is not an expected known issue."""
        return self.status in FAILURES and not (self.known_issue and self.known_issue.get("matched"))


def exit_code(records: Iterable[Record]) -> int:
    """``run``'s exit code over its records: 1 on any unexpected failure, else 0."""
    return 1 if any(r.failed for r in records) else 0
