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
- statistics computed in the low precision instead of float32;
- a layer whose gradients go non-finite under GradScaler's 2**16 scaling
  (the scaler then skips every step: named as such).

Judged with the autocast dtype's rounding against the float64 network.
The ``grad-scaler`` cases (use ``autocast-grad-scaler``) run float16 autocast
on every device and a real ``torch.amp.GradScaler`` around DDP's backward and
SGD's step: a skipped step is a failure (the oracle's gradients are finite),
and gradients scaled by 2**16 reach SyncBN's backward (pytorch#195701).
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


# A real torch.amp.GradScaler (float16 autocast on every device; under DDP, which it needs: an optimizer steps
# one network). The loss's gradient ~ scale * (mean + N(0, 1)), (name, mean, scale): a mean over 1024 outputs
# ("loss-2-10": 64 each once scaled by 2**16). In these pooled networks a larger loss overflows the classifier's
# half bias gradient (a sum over the batch of what SyncBN's sums get a fraction of) before SyncBN's sums: the
# scaler then skips the step for every layer, nn.BatchNorm's too, so the layer cases of mixed-precision are what
# reach pytorch#195701's overflow.
LOSSES = {"loss-2-10": (1.0, 2.0**-10)}
SCALED = (("cnn", "loss-2-10", "uneven-8-6", True), ("resblock", "loss-2-10", "uneven-8-6", True),
          ("cnn", "loss-2-10", "empty-5-0-4", False))


def _scaled(net: str, loss: str, layout: str, default: bool) -> Case:
    mean, scale = LOSSES[loss]
    batches = tuple(int(b) for b in layout.split("-")[1:])
    ws = len(batches)
    return Case(id=f"{FAMILY}/grad-scaler/{net}/ddp/{loss}/{layout}/ws{ws}", family=FAMILY, batch_sizes=batches,
                spatial=((4, 4),) * ws, channels=3, scenario="model", model=net, optimizer="sgd", ddp=("ddp",),
                steps=("train", "train", "eval"), use="autocast-grad-scaler", grad_mean=mean, grad_scale=scale,
                default=default)


def cases() -> list[Case]:
    return ([_case(*values, default) for values, default in covering.product(NETWORKS, WRAPS, STEPS, LAYOUTS)]
            + [_scaled(*row) for row in SCALED])
