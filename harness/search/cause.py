"""What a failure is caused by, as search groups findings: where it starts, and what the case needs.

One defect shows many ways: a statistics kernel that drops values gives a
wrong output, then wrong running statistics, gradients and evaluations, NaN
in one case and a small error in another, and which tensor fails first
depends on which rank is empty. Search reports one finding per cause, with
the other ways it showed listed under it as its symptoms.

A cause (:class:`Cause`) is the implementation, the status, and the
*origin*: where the failure starts.

- A mismatch starts at the earliest stage of the data flow that fails in the
  first failing step (every rank's tensors of that step together), in this
  order (:data:`STAGES`): the training forward (the output: batch statistics
  and normalization), ``num_batches_tracked``, the running statistics, the
  evaluation forward, the backward, the optimizer's parameters and state,
  then the checks that the ranks agree. A later stage's failure is what an
  earlier stage's defect would also produce, so an earlier cause *explains*
  it (:meth:`Cause.explains`). NaN and a wrong value are one origin; a wrong
  dtype, layout or shape of a tensor is a cause of its own.
- When the ranks issued different collectives, the first divergence's
  operation (``desync all_gather``) is the origin, ahead of what follows.
- An error's origin is its exception type, a crash's its signal, a hang's
  ``timeout``.

The *condition* of a case (:func:`condition`) is the set of its
non-plain traits, coarsely: half input, float64 parameters, channels_last,
an empty rank, uneven batches, more than 65,536 values per channel on a
rank, ``momentum=None``, an offset input, a training forward under
no_grad, and so on. A shrunk case keeps what its failure needs, so its
condition is the cause's condition: a failing case *meets* it when it has
every trait in it. Two shrunk failures of one origin whose conditions nest
(one within the other) are one cause; a new failure of an origin that an
earlier finding explains, in a case that meets that finding's condition, is
another symptom of it and is not shrunk. A defect that shows in the
plainest case (an empty condition) explains every later failure of its
origin, and hides other defects of that origin until it is fixed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from harness.catalog.case import Case
from harness.judge.metric_key import MetricKey
from harness.judge.status import RankStatus, Status
from harness.results.records import Record

STAGES = ("training forward", "num_batches_tracked", "running statistics", "evaluation forward", "backward",
          "optimizer", "agreement across ranks")
LARGE = 1 << 16  # values per channel on one rank past which a case is "large" (float16 counts overflow there)
_STRUCTURAL = ("dtype", "layout", "shape")


@dataclass(frozen=True)
class Cause:
    """Where a failure of one implementation starts (see the module docstring)."""

    impl: str
    status: Status
    origin: str  # a stage of STAGES for a mismatch of values; else the structural check, the desync, the error
    staged: bool = False  # origin is a stage: an earlier stage explains a later one

    def explains(self, other: "Cause") -> bool:
        """Whether a defect starting here would also produce ``other``: the same implementation and status, and
        the same origin or, for stages, an earlier one."""
        if (self.impl, self.status) != (other.impl, other.status):
            return False
        if self.staged and other.staged:
            return STAGES.index(self.origin) <= STAGES.index(other.origin)
        return self.origin == other.origin

    def __str__(self) -> str:
        return f"{self.impl}: {self.status.value} ({'in the ' if self.staged else ''}{self.origin})"


def _stage(key: MetricKey) -> Optional[str]:
    """The stage a failing tensor belongs to, None for one outside the data flow (a scenario's own check)."""
    if key.across_ranks:
        return STAGES[6]
    if key.step is None:
        return None
    leaf, quantity = key.leaf, key.quantity
    if key.summed or quantity.startswith(("grad", "penalized_grad")):
        return STAGES[4]
    if quantity.startswith(("param.", "opt.")):
        return STAGES[5]
    if leaf == "num_batches_tracked":
        return STAGES[1]
    if leaf in ("running_mean", "running_var"):
        return STAGES[2]
    if leaf == "output":
        return STAGES[3] if key.phase == "eval" else STAGES[0]
    return None


def _mismatch_origin(record: Record) -> tuple[str, bool]:
    failing = record.failing_metrics()
    if not failing:
        return "mismatch", False
    first_step = MetricKey.parse(failing[0]).order
    at_step = [n for n in failing if MetricKey.parse(n).order == first_step]
    for name in at_step:  # a wrong dtype, layout or shape is its own cause, ahead of values
        kind = record.metrics[name].kind
        if kind is not None and kind.value in _STRUCTURAL:
            return f"{MetricKey.parse(name).kind}: {kind.value}", False
    stages = [s for s in (_stage(MetricKey.parse(n)) for n in at_step) if s is not None]
    if stages:
        return min(stages, key=STAGES.index), True
    return MetricKey.parse(at_step[0]).kind, False


def cause_of(record: Record) -> Optional[Cause]:
    """The cause of a failed record (a mismatch, error, crash or hang), None for any other."""
    status = record.status
    if status not in (Status.MISMATCH, Status.ERROR, Status.CRASH, Status.HANG):
        return None
    if record.desync:
        calls = record.desync_calls()
        return Cause(record.impl, status, f"desync {calls[0].op if calls else 'missing collective'}")
    if status == Status.MISMATCH:
        origin, staged = _mismatch_origin(record)
        return Cause(record.impl, status, origin, staged)
    if status == Status.ERROR:
        rank = record.first_rank(RankStatus.ERROR)
        return Cause(record.impl, status, (rank.exception_type or "error") if rank else "error")
    if status == Status.CRASH:
        rank = record.first_rank(RankStatus.CRASH)
        return Cause(record.impl, status, (rank.signal or f"exit {rank.exit_code}") if rank else "crash")
    return Cause(record.impl, status, "timeout")


def condition(case: Case) -> frozenset[str]:
    """The case's non-plain traits, coarsely (see the module docstring): what a shrunk case keeps."""
    out = set()
    half = ("float16", "bfloat16")
    if case.dtype in half:
        out.add("half input")
    if case.param_dtype in half:
        out.add("half parameters")
    if "float64" in (case.dtype, case.param_dtype) and case.dtype != case.param_dtype:
        out.add("float64 with float32")
    if case.memory_format != "contiguous":
        out.add("channels_last")
    if case.grad_memory_format and case.grad_memory_format != case.memory_format:
        out.add("gradient in another memory format")
    if case.input_layout != "dense":
        out.add(f"{case.input_layout} input")
    rows = [case.sizes_at(s) for s in range(len(case.steps))] or [case.batch_sizes]
    if any(0 in row for row in rows):
        out.add("an empty rank")
    if any(len(set(row)) > 1 for row in rows) or len(set(map(tuple, case.spatial))) > 1:
        out.add("uneven ranks")
    counts = [b * math.prod(sp) for row in rows for b, sp in zip(row, case.spatial)]
    if counts and max(counts) > LARGE:
        out.add(f"more than {LARGE:,} values per channel on a rank")
    if case.step_batch_sizes:
        out.add("batch sizes that change")
    if case.momentum is None:
        out.add("momentum=None")
    if not case.affine:
        out.add("affine=False")
    if not case.track_running_stats:
        out.add("track_running_stats=False")
    if case.groups:
        out.add("process subgroups")
    if case.input_mean and abs(case.input_mean) >= 100:
        out.add("a large offset")
    if case.input_scale and case.input_scale < 0.01:
        out.add("a tiny spread")
    if case.constant_channels:
        out.add("constant channels")
    if case.backend:
        out.add(case.backend)
    if case.scenario != "layer":  # a training system: its use, DDP, compile and options (the network and the
        # optimizer are choices, not traits: a shrink may move between them)
        if case.use:
            out.add(f"use {case.use}")
        out.update(f"ddp {d}" for d in case.ddp)
        out.update(f"compile {c}" for c in case.compile)
        out.update(f"option {o}" for o in case.options)
    for kind, words in (("eval", "evaluation"), ("nograd", "a forward under no_grad"),
                        ("eval-rank0", "evaluation on rank 0 alone"), ("fwd", "two forwards, one backward")):
        if kind in case.steps:
            out.add(words)
    return frozenset(out)


def meets(case_condition: frozenset[str], cause_condition: frozenset[str]) -> bool:
    """Whether a case with ``case_condition`` has every trait of ``cause_condition``."""
    return cause_condition <= case_condition


def nested(a: frozenset[str], b: frozenset[str]) -> bool:
    """Whether two shrunk conditions are one within the other (the same cause, shrunk two ways)."""
    return a <= b or b <= a


def describe(cond: frozenset[str]) -> str:
    """A condition in words: ``an empty rank, momentum=None``; ``the plainest case`` when empty."""
    return ", ".join(sorted(cond)) or "the plainest case"
