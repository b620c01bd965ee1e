"""How bad a failure is and whom it reaches: the order findings are reported in.

Severity is what a user would suffer, worst first (:data:`KINDS`):

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
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from harness.judge.metric import Problem
from harness.judge.metric_key import MetricKey
from harness.results.records import Record, Status

KINDS = ("silent non-finite", "silent wrong value", "hang", "crash", "error", "wrong dtype or layout", "precision")
ULP_SCALE = 64  # unit roundoffs of a tensor's dtype below which an error is precision, not a wrong value
_UNIT_ROUNDOFF = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24, "float64": 2.0**-53}
_PER_INPUT = ("output", "grad_input")  # tensors in the input's dtype; the rest are in the parameters'
HALF_MAX = 65504  # values per channel past which a float16 count overflows


@dataclass(frozen=True)
class Assessment:
    """A failing record's kind (its index in :data:`KINDS` is its rank), worst error, reach and effect."""

    kind: str
    rel_err: Optional[float]  # the largest relative error of a failing value, where one was compared
    quantity: Optional[str]  # the failing tensor it was measured on (``output``, ``running_var``, ...)
    reach: tuple[str, ...] = ()
    common: bool = False
    rare: tuple[str, ...] = field(default=())

    @property
    def rank(self) -> int:
        """0 for the worst kind; sorts findings worst first."""
        return KINDS.index(self.kind)

    def notice(self) -> str:
        """One line: what a user would notice in training."""
        q = self.quantity or "a result"
        err = f" (relative error {self.rel_err:.2g})" if self.rel_err is not None and math.isfinite(self.rel_err) \
            else ""
        return {
            "silent non-finite": f"NaN/Inf in {q} with no error: the loss or eval turns NaN",
            "silent wrong value": f"{q} silently wrong{err}: " + (
                "eval after training differs" if q.startswith("running") else
                "momentum=None's average and checkpoints count the wrong number of steps"
                if q == "num_batches_tracked" else "training converges differently"),
            "hang": "the job stalls until a collective times out",
            "crash": "a rank dies and takes the job with it",
            "error": "training stops with an exception that names the problem",
            "wrong dtype or layout": f"{q} has the right values in the wrong dtype or memory format "
                                     "(memory, speed, downstream dtype errors)",
            "precision": f"{q} off by a few units in the last place{err}: nothing a user sees",
        }[self.kind]

    def summary(self) -> str:
        """``silent wrong value (rel err 0.031); reach: common (...)``."""
        err = f" (relative error {self.rel_err:.2g})" if self.rel_err is not None and math.isfinite(self.rel_err) \
            and self.kind in ("silent wrong value", "precision") else ""
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
        return Assessment(record.status.value, None, None, tags, common, rare)
    if record.status != Status.MISMATCH:
        return None
    failing = {name: m for name, m in record.metrics.items() if not m.ok}
    nonfinite = [n for n, m in failing.items() if m.kind is Problem.NON_FINITE]
    if nonfinite:
        return Assessment("silent non-finite", math.inf, _quantity(nonfinite[0]), tags, common, rare)
    valued = {n: m for n, m in failing.items() if not m.problem and math.isfinite(m.max_rel_err)}
    if not valued:  # a structural problem only (dtype, layout, shape, an invariant)
        name = next(iter(failing), None)
        structural = failing[name].kind if name else None
        kind = "wrong dtype or layout" if structural in (Problem.DTYPE, Problem.LAYOUT) else "silent wrong value"
        return Assessment(kind, None, _quantity(name) if name else None, tags, common, rare)
    name = max(valued, key=lambda n: valued[n].max_rel_err / _unit(_quantity(n), params))
    worst = valued[name]
    quantity = _quantity(name)
    kind = "precision" if worst.max_rel_err <= ULP_SCALE * _unit(quantity, params) else "silent wrong value"
    return Assessment(kind, worst.max_rel_err, quantity, tags, common, rare)


def _unit(quantity: str, params: dict) -> float:
    dtype = params.get("dtype") if quantity in _PER_INPUT else params.get("param_dtype")
    return _UNIT_ROUNDOFF.get(dtype or "float32", 2.0**-24)


def reach(params: dict) -> tuple[tuple[str, ...], bool, tuple[str, ...]]:
    """(the common configurations the case uses, whether it is common throughout, what makes it rare)."""
    dtype, pdtype = params.get("dtype", "float32"), params.get("param_dtype", "float32")
    sizes = list(params.get("batch_sizes") or [])
    steps = list(params.get("steps") or [])
    tags, rare = [], []
    if dtype in ("float16", "bfloat16") and pdtype == "float32":
        tags.append(f"{dtype} input with float32 parameters (autocast)")
    elif dtype in ("float16", "bfloat16") and pdtype == dtype:
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
    common = not rare and dtype in ("float32", "float16", "bfloat16")
    return tuple(tags), common, tuple(rare)
