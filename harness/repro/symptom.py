"""What a short repro file checks: the one symptom of a failing record, as plain data.

A record may fail in several ways at once (a wrong output and a wrong
``num_batches_tracked``); an issue-ready repro shows exactly one of them, so
that fixing it makes the file pass. The symptom is the record's first failure
in the order :mod:`harness.search.signature` uses (the earliest step, the
scenario's order within it), which is also what a finding is named by:

- ``mismatch`` of a tensor: which one (``output``, ``grad_input``,
  ``grad_weight``, ``grad_bias``, ``running_mean``, ``running_var``,
  ``num_batches_tracked``), and what is wrong with it: its values (``value``),
  NaN/Inf where the truth is finite (``non-finite``), its ``dtype``, memory
  format (``layout``) or ``shape``, or that the ranks of a group disagree
  bitwise (``across-ranks``);
- ``error``: the exception type and message of the first rank that raised;
- ``crash``: the first dead rank's signal (or exit code);
- ``hang``: the ranks did not finish.

A failure the short form cannot state (the collectives a rank issued, an
input modified in place, a converted model's structure) has no symptom here:
:func:`symptom_of` says why, and ``repro --long`` writes the generated form.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional, Union

from harness.judge.metric import Problem
from harness.judge.metric_key import MetricKey
from harness.judge.status import RankStatus, Status
from harness.results.records import Record

QUANTITIES = ("output", "grad_input", "grad_weight", "grad_bias", "running_mean", "running_var",
              "num_batches_tracked")


class Aspect(str, enum.Enum):
    """What is wrong with a tensor besides a structural :class:`~harness.judge.metric.Problem`."""

    VALUE = "value"  # its values
    ACROSS_RANKS = "across-ranks"  # the ranks of a group disagree bitwise


# What a mismatch breaks in the tensor, in words.
WORDS = {Aspect.VALUE: "differs from BatchNorm's", Problem.NON_FINITE: "is NaN/Inf where BatchNorm's is finite",
         Problem.DTYPE: "has the wrong dtype", Problem.LAYOUT: "loses the input's memory format",
         Problem.SHAPE: "has the wrong shape", Aspect.ACROSS_RANKS: "differs between the ranks of a group"}


class NoSymptom(ValueError):
    """The record's failure is not one a short repro can state (the reason is the message)."""


@dataclass(frozen=True)
class Symptom:
    """One failure a short file checks for: ``status`` and its particulars."""

    status: Status  # one of FAILURES: mismatch, error, crash, hang
    quantity: Optional[str] = None  # mismatch: one of QUANTITIES
    aspect: Optional[Union[Problem, Aspect]] = None  # mismatch: what is wrong with the quantity
    step: Optional[int] = None  # mismatch: the first step it shows in
    exception_type: Optional[str] = None  # error
    signal: Optional[str] = None  # crash: "SIGABRT", or "exit 3"
    message: str = ""  # the record's message, for the file's docstring

    def describe(self) -> str:
        """A few words: ``running_var differs``, ``raises TypeError``, ``a rank dies (SIGABRT)``."""
        if self.status is Status.ERROR:
            return f"raises {self.exception_type}"
        if self.status is Status.CRASH:
            return f"a rank dies ({self.signal})"
        if self.status is Status.HANG:
            return "the ranks hang"
        return f"{self.quantity} {WORDS[self.aspect]}"


def aspect_of(kind: Optional[Problem]) -> Union[Problem, Aspect]:
    """A metric's kind of structural problem, or :attr:`Aspect.VALUE` when it has none."""
    return kind if kind is not None else Aspect.VALUE


def symptom_of(record: Record) -> Symptom:
    """The first failure of a failing ``record`` (see the module docstring); raises :class:`NoSymptom`."""
    first = record.message.splitlines()[0] if record.message else ""
    if record.status == Status.ERROR:
        rank = record.first_rank(RankStatus.ERROR)
        return Symptom(Status.ERROR, exception_type=(rank.exception_type if rank else None) or "Exception",
                       message=(rank.message if rank and rank.message else first))
    if record.status == Status.CRASH:
        rank = record.first_rank(RankStatus.CRASH)
        sig = (rank.signal or f"exit {rank.exit_code}") if rank else "crash"
        return Symptom(Status.CRASH, signal=sig, message=first)
    if record.status == Status.HANG:
        return Symptom(Status.HANG, message=first)
    if record.status != Status.MISMATCH:
        raise NoSymptom(f"a {record.status.value} record shows no failure to reproduce")
    failing = record.failing_metrics()
    for name in failing:
        sym = _tensor_symptom(name, record.metrics[name].kind, first)
        if sym is not None:
            return sym
    raise NoSymptom(f"the short form checks tensors against BatchNorm; this record's failures are "
                    f"{', '.join(sorted(failing)) or first!s} (use --long for the generated form)")


def _tensor_symptom(name: str, kind: Optional[Problem], message: str) -> Optional[Symptom]:
    key = MetricKey.parse(name)
    if key.summed and key.quantity in ("grad_weight", "grad_bias") and not key.across_ranks:
        return Symptom(Status.MISMATCH, key.quantity, aspect_of(kind), key.step, message=message)
    if key.step is None or key.phase is None or key.tensor not in QUANTITIES:
        return None
    aspect = Aspect.ACROSS_RANKS if key.across_ranks else aspect_of(kind)
    return Symptom(Status.MISMATCH, key.tensor, aspect, key.step, message=message)
