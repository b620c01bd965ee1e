"""validation: evaluation on a subset of ranks while the others wait, between training steps.

Catches a collective issued in evaluation. Users validate on rank 0 (or on the ranks holding the validation shard) and
call the unwrapped module there (``model.module`` under DDP). No collective
may be issued then: one would hang the evaluating ranks, waiting for peers
that are not evaluating (pytorch#48988, #54059, #61481). Here a collective in
such a step raises at once and is attributed to its rank and call.

Rank 0 alone (``eval-rank0``) or every rank but the last (``eval-subset``),
between training steps, crossed with networks, DDP or none and world sizes 2
and 3; the evaluating ranks' outputs and buffers are judged against the
float64 network, and training after validation must go on as before.
"""

from harness.catalog.case import Case
from harness.catalog import covering

FAMILY = "validation"

WHO = ("eval-rank0", "eval-subset")
NETWORKS = ("cnn", "resblock")
WRAPS = (("local", ()), ("ddp", ("ddp",)))
LAYOUTS = (("ws3-2-4-3", (2, 4, 3)), ("ws2-3-5", (3, 5)))


def _case(who: str, net: str, wrap: tuple, layout: tuple, default: bool) -> Case:
    (wname, ddp), (lname, batches) = wrap, layout
    ws = len(batches)
    return Case(id=f"{FAMILY}/{who}/{net}/{wname}/{lname}/ws{ws}", family=FAMILY, batch_sizes=batches,
                spatial=((4, 4),) * ws, channels=3, scenario="model", model=net,
                optimizer="sgd" if ddp else None, ddp=ddp, steps=("train", who, "train", who), default=default)


def cases() -> list[Case]:
    return [_case(*values, default) for values, default in covering.product(WHO, NETWORKS, WRAPS, LAYOUTS)]
