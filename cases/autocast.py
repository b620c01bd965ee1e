"""autocast: conv + SyncBN + activation under ``torch.autocast``, as mixed-precision training runs it.

Every mixed-precision case elsewhere feeds a half tensor by hand; users get
half activations from autocast (bfloat16 on CPU, float16 on CUDA) with
float32 parameters, and autocast's own cast rules for batch normalization.

Catches:
- a SyncBN whose all_gather or kernels mishandle the autocast dtype (the half
  empty-rank gather of pytorch#74944's branch, fairscale's half counts);
- an output dtype differing from ``nn.BatchNorm2d``'s under the same autocast
  (the expected dtype is taken from a plain network run under autocast on
  the rank);
- statistics computed in the low precision instead of float32.

Judged with the autocast dtype's rounding against the float64 network.
Networks, DDP or none, training then evaluation (or validation on rank 0
between training steps), and batch layouts (one with an empty rank); the
default selection is pairwise.
"""

from harness.catalog.case import Case
from harness.catalog import covering

FAMILY = "autocast"

NETWORKS = ("cnn", "resblock")
WRAPS = (("local", ()), ("ddp", ("ddp",)))
STEPS = (("train-eval", ("train", "train", "eval")), ("validation", ("train", "eval-rank0", "train", "eval")))
LAYOUTS = (("uneven-3-5", (3, 5)), ("empty-2-0-3", (2, 0, 3)))


def _case(net: str, wrap: tuple, steps: tuple, layout: tuple, default: bool) -> Case:
    (wname, ddp), (sname, kinds), (lname, batches) = wrap, steps, layout
    ws = len(batches)
    return Case(id=f"{FAMILY}/{net}/{wname}/{sname}/{lname}/ws{ws}", family=FAMILY, batch_sizes=batches,
                spatial=((4, 4),) * ws, channels=3, scenario="model", model=net,
                optimizer="sgd" if ddp else None, ddp=ddp, steps=kinds, use="autocast", default=default)


def cases() -> list[Case]:
    return [_case(*values, default) for values, default in covering.product(NETWORKS, WRAPS, STEPS, LAYOUTS)]
