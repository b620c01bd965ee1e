"""One collective call a rank issued, as recorded: :class:`Call`.

The recorder (:mod:`harness.engine.collectives`) builds a ``Call`` for every
collective an implementation issues; the checks on what the ranks said (the
desync checks here in the judge, the pool's reuse rule, the deadlock rule, a
record's fingerprint, a finding's signature) read it. Records, the sink file
and the messages between processes carry it as plain JSON, in the one form
:meth:`Call.to_dict` writes and :meth:`Call.from_dict` reads:

    {"op": "all_gather", "group": [0, 1], "step": 0, "dtype": "float32", "shape": [9], "numel": 9}

(``dtype``, ``shape`` and ``numel`` only for a call with a tensor argument;
``group`` is the ranks of its process group, empty when unknown.) The form is
stored in records, so it does not change; code converts at its edges and
never reads the dict by key.

"The same call" across the ranks of a group is :meth:`Call.signature`: op,
dtype and element count. The shape may differ (a gather of a rank's own
slice) and the step is the scenario's bookkeeping, but a rank that sends
another number of bytes, or another dtype, desynchronizes its peers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional


@dataclass(frozen=True)
class Call:
    """A recorded collective: its op, group ranks, tensor (dtype, shape, element count) and the case's step."""

    op: str
    group: tuple[int, ...] = ()
    dtype: Optional[str] = None  # torch's name (``float16``); None for a call without a tensor (a barrier)
    shape: Optional[tuple[int, ...]] = None
    numel: Optional[int] = None
    step: Optional[int] = None

    def signature(self) -> tuple:
        """What must agree across the ranks of a group: ``(op, dtype, numel)``."""
        return self.op, self.dtype, self.numel

    def tensor(self) -> str:
        """``float16[2,11]``; '' for a call without a tensor."""
        if self.dtype is None:
            return ""
        return f"{self.dtype}[{','.join(map(str, self.shape or ()))}]"

    def describe(self, *, op: bool = True) -> str:
        """``all_gather float16[11]``; ``float16[11]`` without the op (the op alone when there is no tensor)."""
        return " ".join(filter(None, [self.op if op else "", self.tensor()])) or self.op

    def to_dict(self) -> dict:
        """The stored form (see the module docstring)."""
        d: dict = {"op": self.op, "group": list(self.group), "step": self.step}
        if self.dtype is not None:
            d.update(dtype=self.dtype, shape=list(self.shape or ()), numel=self.numel)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Call":
        """A call from its stored form."""
        shape = d.get("shape")
        return cls(op=d["op"], group=tuple(d.get("group") or ()), dtype=d.get("dtype"),
                   shape=tuple(shape) if shape is not None else None, numel=d.get("numel"), step=d.get("step"))


def read_calls(stored: Optional[Iterable[dict]]) -> Optional[list[Call]]:
    """A rank's calls from their stored form, in order; None stays None (the calls are not known)."""
    return None if stored is None else [Call.from_dict(d) for d in stored]
