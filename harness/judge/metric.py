"""How one observed tensor compares with the truth: the :class:`Metric` every record carries per tensor.

Plain data without torch, so records can be read, diffed and reported where
torch is not importable. JSON has no NaN or Inf: :meth:`Metric.to_dict`
writes them as the strings ``"nan"``/``"inf"`` and :meth:`Metric.from_dict`
reads them back as floats, so every reader sees numbers.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Iterable, Optional


class Problem(str, enum.Enum):
    """The kind of a structural mismatch that readers tell apart (search's signatures, a repro's symptom, a
    finding's severity): set where the mismatch is found, never read back from its message."""

    DTYPE = "dtype"
    NON_FINITE = "non-finite"
    LAYOUT = "layout"
    SHAPE = "shape"


# Records written before metrics carried their kind: the kind their message says, found as it was then.
_OLD_MESSAGES = (("dtype", Problem.DTYPE), ("non-finite", Problem.NON_FINITE), ("not in torch.", Problem.LAYOUT),
                 ("shape", Problem.SHAPE))


def _kind_of_old(problem: Optional[str]) -> Optional[Problem]:
    if not problem:
        return None
    return next((kind for needle, kind in _OLD_MESSAGES if needle in problem), None)


def _encode(x: float):
    return float(x) if math.isfinite(x) else str(float(x))


def _decode(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


@dataclass(frozen=True)
class Metric:
    """One compared tensor: its largest errors, the tolerance at its worst element, and err/tol there.

    ``ratio <= 1`` passes. ``problem`` is a structural mismatch (wrong dtype,
    shape or memory format, NaN/Inf where the truth is finite, an invariant
    broken) that fails whatever the numbers say; ``kind`` says which of
    :class:`Problem` it is, when it is one of them.
    """

    max_abs_err: float
    max_rel_err: float
    tol: float
    ratio: float
    problem: Optional[str] = None
    kind: Optional[Problem] = None

    @property
    def ok(self) -> bool:
        return self.problem is None and self.ratio <= 1.0

    @classmethod
    def failure(cls, problem: str, kind: Optional[Problem] = None) -> "Metric":
        """A structural mismatch: no numbers to compare, only what is wrong (and its kind, if it has one)."""
        return cls(math.nan, math.nan, 0.0, math.inf, problem, kind)

    @classmethod
    def passed(cls) -> "Metric":
        """A check with nothing to round that holds (the implementation refused what it must refuse, ...)."""
        return cls(0.0, 0.0, 0.0, 0.0)

    def to_dict(self) -> dict:
        d = {"max_abs_err": _encode(self.max_abs_err), "max_rel_err": _encode(self.max_rel_err),
             "tol": _encode(self.tol), "ratio": _encode(self.ratio), "ok": self.ok, "problem": self.problem}
        if self.kind is not None:
            d["kind"] = self.kind.value
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Metric":
        problem = d.get("problem")
        kind = Problem(d["kind"]) if d.get("kind") else _kind_of_old(problem)
        return cls(_decode(d.get("max_abs_err")), _decode(d.get("max_rel_err")), _decode(d.get("tol")),
                   _decode(d.get("ratio")), problem, kind)

    def describe(self) -> str:
        """``max abs err 0.0327 > tol 3.49e-05 (938x)``, or the problem."""
        if self.problem:
            return self.problem
        return f"max abs err {self.max_abs_err:.3g} > tol {self.tol:.3g} ({self.ratio:.3g}x)"


def worst_ratio(metrics: Iterable[Metric]) -> Optional[float]:
    """The largest err/tol ratio among ``metrics`` (None when there are none; NaN ignored, Inf kept)."""
    ratios = [m.ratio for m in metrics if not math.isnan(m.ratio)]
    return max(ratios) if ratios else None
