"""The name of one judged quantity, built and read in one place: :class:`MetricKey`.

A record's metrics are keyed by name, in one grammar:

- ``rank<r>.step<s>.<phase>.<tensor>``: one rank's tensor at one step, in
  that step's phase (``train`` or ``eval``); the tensor may be dotted (a
  model's ``grad.0.weight``, ``shared.running_mean``);
- the same with ``.across_ranks`` appended: the check that the tensor is the
  same on every rank of a group;
- ``step<s>.<tensor>_sum``: a parameter gradient summed over the ranks (what
  DDP uses), judged once, without a rank or a phase;
- a scenario's own name outside steps (``convert.00``, ``reverted.01``,
  ``revert.eval.output``, ``layer.bias``): only ``tensor`` is set, to the
  whole name.

The rank prefix is added by the parent when it gathers the ranks' metrics; a
rank names its own metrics without it. ``str(MetricKey.parse(name)) == name``
for every name of this grammar, which a test checks over real records.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Optional

_NAME = re.compile(r"^(?:rank(?P<rank>\d+)\.)?(?:step(?P<step>\d+)\.)?(?P<rest>.+)$")
ACROSS = ".across_ranks"
SUM = "_sum"


@dataclass(frozen=True)
class MetricKey:
    """What a metric judges: a tensor, at which step and phase, on which rank (see the module docstring)."""

    tensor: str
    step: Optional[int] = None
    phase: Optional[str] = None  # "train" or "eval" for a step's tensors; None for a sum or a scenario's own
    rank: Optional[int] = None
    across_ranks: bool = False

    def __str__(self) -> str:
        parts = [f"rank{self.rank}"] if self.rank is not None else []
        if self.step is not None:
            parts.append(f"step{self.step}")
        if self.phase is not None:
            parts.append(self.phase)
        return ".".join(parts + [self.tensor]) + (ACROSS if self.across_ranks else "")

    @classmethod
    def parse(cls, name: str) -> "MetricKey":
        """The key a metric's name spells (any string parses: one outside the grammar is all ``tensor``)."""
        m = _NAME.match(name)
        if m is None:
            return cls(tensor=name)
        rank = int(m["rank"]) if m["rank"] is not None else None
        step = int(m["step"]) if m["step"] is not None else None
        rest = m["rest"]
        across = rest.endswith(ACROSS)
        if across:
            rest = rest[:-len(ACROSS)]
        phase = None
        if step is not None and "." in rest:
            phase, rest = rest.split(".", 1)
        return cls(tensor=rest, step=step, phase=phase, rank=rank, across_ranks=across)

    def on_rank(self, rank: int) -> "MetricKey":
        """This key as the parent files it for ``rank``."""
        return replace(self, rank=rank)

    @property
    def summed(self) -> bool:
        """A gradient summed over the ranks (``step<s>.grad_weight_sum``)."""
        return self.step is not None and self.phase is None and self.tensor.endswith(SUM)

    @property
    def quantity(self) -> str:
        """The tensor judged, without the sum's suffix: ``running_var``, ``grad_weight``, ``grad.0.weight``."""
        return self.tensor[:-len(SUM)] if self.summed else self.tensor

    @property
    def leaf(self) -> str:
        """The quantity's last part: ``running_mean`` of a model's ``1.running_mean``, ``bias`` of ``grad.0.bias``."""
        return self.quantity.rsplit(".", 1)[-1]

    @property
    def kind(self) -> str:
        """The name without its step and rank (``train.output``, ``eval.running_var.across_ranks``); a
        scenario's numbered names as one (``convert.3`` -> ``convert``, ``reverted.0`` -> ``reverted``): what a
        search signature keeps, so that a shrunk case with fewer steps or ranks fails the same way."""
        head, _, number = self.tensor.partition(".")
        if self.step is None and (head == "convert" or number.isdigit()):
            return head
        return str(replace(self, step=None, rank=None))

    @property
    def order(self) -> int:
        """Sort key of the step (a name without one sorts last)."""
        return self.step if self.step is not None else 10**6


def step_key(step: int, phase: str, tensor: str, *, across_ranks: bool = False) -> str:
    """The name of ``tensor`` at ``step`` in ``phase`` (a rank names its own metrics with this)."""
    return str(MetricKey(tensor, step=step, phase=phase, across_ranks=across_ranks))


def sum_key(step: int, tensor: str) -> str:
    """The name of the sum over ranks of a parameter gradient at ``step`` (``step0.grad_weight_sum``)."""
    return str(MetricKey(tensor + SUM, step=step))
