"""double-backward: a gradient penalty through SyncBN (``create_graph=True``), as WGAN-GP, R1 regularization and
meta-learning take one.

Catches:
- a backward with no derivative of its own: torch's SyncBatchNorm fails with
  "the derivative for 'aten::batch_norm_backward_elemt' is not implemented"
  (pytorch#61222);
- a differentiable backward whose collectives are not differentiated, so the
  penalty's gradient misses the other ranks' share.

Each rank backpropagates ``sum(y * dy) + 0.5 * sum(g ** 2)`` with ``g`` its
input gradient, and is judged against the float64 oracle's second derivative
of the same loss over the global batch (:mod:`harness.scenarios.uses`): the
output, the input gradient and its penalized gradient, every parameter's
gradient, the parameters after the optimizer step and the buffers. Networks
(a conv net, a residual block) cross DDP or
none, two dtypes and two batch layouts; the default selection is pairwise.
"""

from harness.catalog.case import Case
from harness.catalog import covering

FAMILY = "double-backward"

NETWORKS = ("cnn", "resblock")
WRAPS = (("local", ()), ("ddp", ("ddp",)))
DTYPES = ("float32", "float64")
LAYOUTS = (("uneven-3-5", (3, 5)), ("ws3-2-4-3", (2, 4, 3)))


def _case(net: str, wrap: tuple, dtype: str, layout: tuple, default: bool) -> Case:
    (wname, ddp), (lname, batches) = wrap, layout
    ws = len(batches)
    return Case(id=f"{FAMILY}/{net}/{wname}/{dtype}/{lname}/ws{ws}", family=FAMILY, batch_sizes=batches,
                spatial=((4, 4),) * ws, channels=3, dtype=dtype, param_dtype=dtype, scenario="model", model=net,
                optimizer="sgd" if ddp else None, ddp=ddp, steps=("train", "train", "eval"), use="double-backward",
                default=default)


def cases() -> list[Case]:
    return [_case(*values, default) for values, default in covering.product(NETWORKS, WRAPS, DTYPES, LAYOUTS)]
