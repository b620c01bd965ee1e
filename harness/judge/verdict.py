"""Why is this case red? Every rule that sets a ran case's status, in the order it applies: one pure module.

Data in (what the ranks did, their metrics, what ``nn.BatchNorm`` refuses, the
collectives each rank issued, the scenario's checks across ranks), a status,
a message and the added metrics out. Nothing here runs a process, reads a
clock or probes torch; the tests drive it with scripted outcomes.

1. **A rank's own verdict** (:func:`rank_verdict`, in the rank). It raised:
   ``error``, with the exception's text. A compared tensor is out of
   tolerance: ``mismatch``, naming the first four. Otherwise ``pass``.
2. **The ranks together** (:func:`from_ranks`, in the parent, over the ranks'
   outcomes after :mod:`harness.engine.attribution` has said who crashed, hung
   or only stopped because a peer failed). Worst first: a crash, a hang, an
   error. Then a task that ran out of time is a hang, a mismatch is a
   mismatch, and ranks that stopped for a peer with no culprit among them
   are an error. Otherwise ``pass``.
3. **What the plain layer refuses too** (:func:`case_verdict`). An ``error``
   where every rank that raised raised exactly what ``nn.BatchNorm`` raises
   on the case's dtypes (:func:`harness.judge.plain_layer.refusal`: layer
   cases on CPU, where it can be probed) is the SyncBN behaving as the layer
   it replaces: ``unsupported``, or ``mismatch`` when another rank's numbers
   were wrong. On CUDA the plain layer is not probed after a run: torch's
   cases that it refuses are ``unsupported`` before they run
   (:mod:`harness.impls.cuda_plan`, from the model of
   :func:`~harness.judge.plain_layer.refusal_on_cuda`).
4. **The first desync.** The first collective the ranks of a group disagreed
   on (:func:`harness.judge.desync.first_divergence`) is named first in the
   message, ahead of the crash or hang it causes; a ``pass`` becomes a
   ``mismatch``.
5. **Across ranks.** A ``pass`` or ``mismatch`` gets the scenario's checks
   across ranks (buffers bitwise equal on every rank, gradient shares that sum
   to the oracle's); one out of tolerance makes it a ``mismatch``, and their
   metrics join the record's.

Before a case runs, a refusal decides instead: :mod:`harness.engine.admission`
(``skipped``, ``unsupported``) and the adapter's own ``unsupported_reason``.
After, :mod:`harness.results.known_issues` may mark a failure *known*; it never
changes the status.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from harness.judge.desync import Divergence, first_divergence
from harness.judge.metric import Metric
from harness.judge.status import RankOutcome, RankStatus, Status

SHOWN = 4  # failing tensors a rank's message names before "(+N more)"
ACROSS_SHOWN = 3  # failing across-rank checks the case's message names


@dataclass(frozen=True)
class Verdict:
    """A ran case's status, its message, the across-rank metrics it adds, and its first desync (if any)."""

    status: Status
    message: str
    metrics: dict[str, Metric] = field(default_factory=dict)
    desync: Optional[Divergence] = None


@dataclass(frozen=True)
class LayerRefusal:
    """What ``nn.BatchNorm`` on ``device`` raises on the case's dtypes (``said``: ``"Type: message"``)."""

    device: str
    dtype: str
    param_dtype: str
    said: str

    def text(self) -> str:
        return (f"nn.BatchNorm on {self.device} refuses {self.dtype} input with {self.param_dtype} parameters too "
                f"({self.said})")


def rank_verdict(metrics: dict[str, Metric], raised: Optional[BaseException] = None) -> tuple[RankStatus, str]:
    """Rule 1: one rank's status and message, from its metrics or the exception it raised."""
    if raised is not None:
        return RankStatus.ERROR, str(raised)[:2000]
    bad = [(name, m) for name, m in metrics.items() if not m.ok]
    if not bad:
        return RankStatus.PASS, ""
    more = f" (+{len(bad) - SHOWN} more)" if len(bad) > SHOWN else ""
    return RankStatus.MISMATCH, "; ".join(f"{name}: {m.describe()}" for name, m in bad[:SHOWN]) + more


def from_ranks(outcomes: list[RankOutcome], timed_out: bool) -> Status:
    """Rule 2: the case's status from its ranks' outcomes, worst first."""
    statuses = {o.status for o in outcomes}
    for rank_status, status in ((RankStatus.CRASH, Status.CRASH), (RankStatus.HANG, Status.HANG),
                                (RankStatus.ERROR, Status.ERROR)):
        if rank_status in statuses:
            return status
    if timed_out:
        return Status.HANG
    if RankStatus.MISMATCH in statuses:
        return Status.MISMATCH
    if RankStatus.PEER_FAILED in statuses:
        return Status.ERROR
    return Status.PASS


def refused_like_the_layer(outcomes: list[RankOutcome], layer: Optional[LayerRefusal]) -> bool:
    """Whether at least one rank raised and every rank that raised gave exactly what the plain layer raises."""
    raised = [o for o in outcomes if o.status is RankStatus.ERROR]
    return (layer is not None and bool(raised)
            and all(f"{o.exception_type}: {o.message}".strip() == layer.said.strip() for o in raised))


def case_verdict(status: Status, outcomes: list[RankOutcome], message: str, *, finished: list[int],
                 layer: Optional[LayerRefusal] = None,
                 across: Callable[[], list[tuple[str, Metric]]] = list) -> Verdict:
    """Rules 3 to 5 over rule 2's ``status``: the ran case's verdict.

    ``message``: who did what (:func:`harness.engine.attribution.message`); ``finished``: the ranks that answered
    with a pass or a mismatch (a collective missing from them counts as skipped); ``layer``: what ``nn.BatchNorm``
    refuses on the case, where it does; ``across``: the scenario's checks across ranks, computed only where rule 5
    applies (they need every rank's answer).
    """
    if status is Status.ERROR and refused_like_the_layer(outcomes, layer):
        # What nn.BatchNorm raises too is documented behaviour: the other ranks' failures, if any, remain.
        if any(o.status is RankStatus.MISMATCH for o in outcomes):
            status, message = Status.MISMATCH, f"{message}; {layer.text()}"
        else:
            status, message = Status.UNSUPPORTED, f"{layer.text()}: the SyncBN raises what it replaces"
    desync = first_divergence({o.rank: o.collectives for o in outcomes}, finished)
    if desync is not None:
        # The cause goes first: the crash, hang or wrong numbers that follow are its consequences.
        message = "; ".join(filter(None, [f"desync: {desync.message}", message]))
        if status is Status.PASS:
            status = Status.MISMATCH
    metrics: dict[str, Metric] = {}
    if status in (Status.PASS, Status.MISMATCH):
        metrics = dict(across())
        bad = [f"{name}: {m.describe()}" for name, m in metrics.items() if not m.ok]
        if bad:
            status = Status.MISMATCH
            message = "; ".join(filter(None, [message, *bad[:ACROSS_SHOWN]]))
    return Verdict(status, message, metrics, desync)
