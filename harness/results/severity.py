"""How bad a failure is and whom it reaches: the order findings are reported in.

Severity is what a user would suffer, worst first (:class:`Severity`, whose
members carry their rank and the line that says what a user would notice):

1. ``silent non-finite``: NaN or Inf in an output, a gradient or a running
   statistic, and no error: the loss turns NaN, or eval after training does;
2. ``silent wrong value``: a value off by more than the dtype can explain (a
   relative error of more than :data:`ULP_SCALE` unit roundoffs of the
   tensor's dtype), and no error: training converges elsewhere, eval differs;
3. ``hang``: the job stalls until a collective times out;
4. ``crash``: a rank dies (a signal or an abnormal exit) and the job with it;
5. ``error``: an exception names the problem; nothing is silently wrong;
6. ``wrong dtype or layout``: the values are right but the output comes back
   in another dtype or memory format (memory, speed, downstream dtype errors);
7. ``precision``: off by a few units in the last place, past the harness's
   tolerance but within :data:`ULP_SCALE` roundoffs: nothing a user sees.

Reach is which common configurations the failing case uses (:func:`reach`,
from the record's ``params``): half or bfloat16 input with float32
parameters (what autocast produces), a fully half model, channels_last, an
uneven or an empty last batch, eval after training, the default momentum; and
what makes it rare (subgroups, momentum=None, hostile inputs, counts past
float16's range). ``common`` says whether every setting of the case is one a
typical training run has.

Severity and :data:`~harness.judge.status.WORST_FIRST` are two orders on
purpose. ``WORST_FIRST`` orders statuses, every one of them (passes and
not-run included), from the status alone: it is how tables sort and color a
record. Severity orders failures only, by what a user suffers, and needs the
evidence to do it: one ``mismatch`` is a silent NaN (worst of all), another a
dtype slip or a last-place difference (the mildest), and a hang costs a user
more than a crash that stops the job at once. Neither can be derived from the
other; :func:`of_status` is where they meet, for the statuses that are their
own severity.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Optional

from harness.catalog.dtypes import HALF_DTYPES, ROUNDOFF_OF
from harness.judge.metric import Problem
from harness.judge.metric_key import MetricKey
from harness.judge.status import Status
from harness.results.records import Record

ULP_SCALE = 64  # unit roundoffs of a tensor's dtype below which an error is precision, not a wrong value
_PER_INPUT = ("output", "grad_input")  # tensors in the input's dtype; the rest are in the parameters'
HALF_MAX = 65504  # values per channel past which a float16 count overflows


class Severity(enum.Enum):
    """A kind of failure, worst first: ``rank`` (0 is the worst) and ``notice``, what a user would notice in
    training (a template over ``{q}``, the failing quantity, ``{err}``, its relative error, and ``{effect}``,
    what a wrong value of it does)."""

    def __new__(cls, label: str, rank: int, notice: str) -> "Severity":
        member = object.__new__(cls)
        member._value_ = label
        member.rank = rank
        member.notice = notice
        return member

    SILENT_NON_FINITE = ("silent non-finite", 0, "NaN/Inf in {q} with no error: the loss or eval turns NaN")
    SILENT_WRONG_VALUE = ("silent wrong value", 1, "{q} silently wrong{err}: {effect}")
    HANG = ("hang", 2, "the job stalls until a collective times out")
    CRASH = ("crash", 3, "a rank dies and takes the job with it")
    ERROR = ("error", 4, "training stops with an exception that names the problem")
    WRONG_DTYPE_OR_LAYOUT = ("wrong dtype or layout", 5, "{q} has the right values in the wrong dtype or memory "
                             "format (memory, speed, downstream dtype errors)")
    PRECISION = ("precision", 6, "{q} off by a few units in the last place{err}: nothing a user sees")

    def __str__(self) -> str:
        return self.value


_OF_STATUS = {Status.HANG: Severity.HANG, Status.CRASH: Severity.CRASH, Status.ERROR: Severity.ERROR}
_WITH_ERROR = (Severity.SILENT_WRONG_VALUE, Severity.PRECISION)  # the kinds whose summary shows the error


def of_status(status: Status) -> Optional[Severity]:
    """The severity a status is by itself (a hang, a crash, an error); None for one the evidence decides
    (a mismatch) or that is no failure."""
    return _OF_STATUS.get(status)


@dataclass(frozen=True)
class Assessment:
    """A failing record's severity, worst error, reach and effect."""

    kind: Severity
    rel_err: Optional[float]  # the largest relative error of a failing value, where one was compared
    quantity: Optional[str]  # the failing tensor it was measured on (``output``, ``running_var``, ...)
    reach: tuple[str, ...] = ()
    common: bool = False
    rare: tuple[str, ...] = field(default=())

    @property
    def rank(self) -> int:
        """0 for the worst kind; sorts findings worst first."""
        return self.kind.rank

    def notice(self) -> str:
        """One line: what a user would notice in training."""
        q = self.quantity or "a result"
        err = f" (relative error {self.rel_err:.2g})" if self.rel_err is not None and math.isfinite(self.rel_err) \
            else ""
        effect = ("eval after training differs" if q.startswith("running") else
                  "momentum=None's average and checkpoints count the wrong number of steps"
                  if q == "num_batches_tracked" else "training converges differently")
        return self.kind.notice.format(q=q, err=err, effect=effect)

    def summary(self) -> str:
        """``silent wrong value (rel err 0.031); reach: common (...)``."""
        err = f" (relative error {self.rel_err:.2g})" if self.rel_err is not None and math.isfinite(self.rel_err) \
            and self.kind in _WITH_ERROR else ""
        where = "common configurations" if self.common else "uncommon configurations"
        rare = f"; needs {', '.join(self.rare)}" if self.rare else ""
        return f"{self.kind}{err}; reach: {where} ({', '.join(self.reach) or 'plain float32'}){rare}"


def _quantity(name: str) -> str:
    """``rank1.step0.train.running_var`` -> ``running_var``; ``step0.grad_weight_sum`` -> ``grad_weight``."""
    return MetricKey.parse(name).leaf


def assess(record: Record) -> Optional[Assessment]:
    """The kind, worst error and reach of a failing record; None when it does not fail."""
    params = record.params or {}
    tags, common, rare = reach(params)
    if record.status in (Status.ERROR, Status.CRASH, Status.HANG):
        return Assessment(of_status(record.status), None, None, tags, common, rare)
    if record.status != Status.MISMATCH:
        return None
    failing = {name: m for name, m in record.metrics.items() if not m.ok}
    nonfinite = [n for n, m in failing.items() if m.kind is Problem.NON_FINITE]
    if nonfinite:
        return Assessment(Severity.SILENT_NON_FINITE, math.inf, _quantity(nonfinite[0]), tags, common, rare)
    valued = {n: m for n, m in failing.items() if not m.problem and math.isfinite(m.max_rel_err)}
    if not valued:  # a structural problem only (dtype, layout, shape, an invariant)
        name = next(iter(failing), None)
        structural = failing[name].kind if name else None
        kind = Severity.WRONG_DTYPE_OR_LAYOUT if structural in (Problem.DTYPE, Problem.LAYOUT) \
            else Severity.SILENT_WRONG_VALUE
        return Assessment(kind, None, _quantity(name) if name else None, tags, common, rare)
    name = max(valued, key=lambda n: valued[n].max_rel_err / _unit(_quantity(n), params))
    worst = valued[name]
    quantity = _quantity(name)
    kind = Severity.PRECISION if worst.max_rel_err <= ULP_SCALE * _unit(quantity, params) \
        else Severity.SILENT_WRONG_VALUE
    return Assessment(kind, worst.max_rel_err, quantity, tags, common, rare)


def _unit(quantity: str, params: dict) -> float:
    dtype = params.get("dtype") if quantity in _PER_INPUT else params.get("param_dtype")
    return ROUNDOFF_OF.get(dtype or "float32", ROUNDOFF_OF["float32"])


def reach(params: dict) -> tuple[tuple[str, ...], bool, tuple[str, ...]]:
    """(the common configurations the case uses, whether it is common throughout, what makes it rare)."""
    dtype, pdtype = params.get("dtype", "float32"), params.get("param_dtype", "float32")
    sizes = list(params.get("batch_sizes") or [])
    steps = list(params.get("steps") or [])
    tags, rare = [], []
    if dtype in HALF_DTYPES and pdtype == "float32":
        tags.append(f"{dtype} input with float32 parameters (autocast)")
    elif dtype in HALF_DTYPES and pdtype == dtype:
        tags.append(f"a fully {dtype} model")
    elif dtype != pdtype:
        rare.append(f"{dtype} input with {pdtype} parameters")
    elif dtype == "float64":
        rare.append("float64")
    if params.get("memory_format", "contiguous") != "contiguous":
        tags.append(params["memory_format"])
    if sizes and 0 in sizes:
        tags.append("an empty rank (an uneven last batch)")
    elif len(set(sizes)) > 1:
        tags.append("uneven batches")
    if "train" in steps and any(s.startswith("eval") for s in steps[steps.index("train"):]):
        tags.append("eval after training")
    if params.get("momentum", 0.1) is None:
        rare.append("momentum=None")
    for key, what in (("groups", "process subgroups"), ("affine", None), ("track_running_stats", None)):
        if key == "groups" and params.get(key):
            rare.append(what)
        elif key != "groups" and params.get(key) is False:
            rare.append(f"{key}=False")
    if params.get("input_mean", 0.0) or params.get("input_scale", 1.0) != 1.0:
        rare.append("inputs with a large offset or a tiny spread")
    spatial = params.get("spatial") or []
    count = sum(n * math.prod(sp) for n, sp in zip(sizes, spatial)) if spatial else 0
    if count > HALF_MAX:
        tags.append(f"{count:,} values per channel")
    common = not rare and dtype in ("float32", *HALF_DTYPES)
    return tuple(tags), common, tuple(rare)
