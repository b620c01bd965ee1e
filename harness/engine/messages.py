"""What crosses process boundaries: a task for the ranks, and each rank's :class:`RankResult`.

Only plain data crosses (dicts of strings, numbers and lists): never a
tensor, an exception object or an adapter. A task names its case (as
``Case.to_dict()``) and its implementation (by name, resolved again in the
rank); a result is :meth:`RankResult.to_dict` on the rank side and
:meth:`RankResult.from_dict` on the parent side, over a pipe (the local
pool) or a key-value store (torchrun).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Optional

from harness.judge.metric import Metric
from harness.judge.status import RankOutcome, RankStatus, Status
from harness.scenarios.across import Across


@dataclass
class Task:
    """One (case, impl) for every rank of a pool or job."""

    case: dict  # Case.to_dict()
    impl: str  # a name harness.impls.resolve takes
    device: str = "cpu"
    compare: Optional[str] = None  # also run this implementation on the same inputs

    def to_dict(self) -> dict:
        return {"case": self.case, "impl": self.impl, "device": self.device, "compare": self.compare}

    @classmethod
    def from_dict(cls, d: dict) -> "Task":
        return cls(case=d["case"], impl=d["impl"], device=d.get("device", "cpu"), compare=d.get("compare"))


@dataclass
class RankResult:
    """What one rank reports of one task: its own verdict, its metrics, and data to judge across ranks.

    ``status`` is ``pass``, ``mismatch`` (some tensor out of tolerance) or
    ``error`` (an exception: type, message and traceback kept). ``across``
    holds what the parent needs to judge the ranks together
    (:class:`~harness.scenarios.across.Across`: the grad_weight and grad_bias
    shares whose sum is compared with the oracle's, the bits of tensors that
    must be bitwise equal on every rank of a group).
    """

    rank: int
    status: RankStatus = RankStatus.ERROR
    message: str = ""
    exception_type: Optional[str] = None
    traceback: Optional[str] = None
    metrics: dict[str, Metric] = field(default_factory=dict)
    # Made when a result is (not when the class is): a long repro file defines Across after this class.
    across: Across = field(default_factory=lambda: Across())
    impl_version: Optional[str] = None
    mode: Optional[str] = None  # a harness.judge.mode.Mode (a str enum: it crosses as its value)
    mode_notes: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    compare: Optional[dict] = None
    collectives: Optional[list] = None
    compile: Optional[dict] = None

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["status"] = self.status.value
        d["metrics"] = {name: m.to_dict() for name, m in self.metrics.items()}
        d["across"] = self.across.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "RankResult":
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["status"] = RankStatus(kw.get("status", "error"))
        kw["metrics"] = {name: Metric.from_dict(m) for name, m in (kw.get("metrics") or {}).items()}
        kw["across"] = Across.from_dict(kw.get("across"))
        return cls(**kw)


@dataclass
class TaskOutcome:
    """What every rank did with one task: the case's status, each rank's outcome, each rank's answer.

    Made in the parent by the local pool and by a torchrun job's writer alike (from attribution).
    """

    status: Status
    ranks: list[RankOutcome]
    results: list[Optional[RankResult]]  # each rank's answer, None when it gave none
    logs: Optional[str] = None  # where the rank logs of a failing task were kept (harness.engine.logs)
