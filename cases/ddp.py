"""ddp: SyncBN inside a small network under DistributedDataParallel, trained for several optimizer steps.

Catches:
- DDP + SyncBN gradients wrong or failing, two forwards before a backward
  and friends (pytorch#175024, #22095, #65907, #110363);
- buffers not synchronized at init with ``broadcast_buffers=False``
  (pytorch#111138): a checkpoint loaded on rank 0 only leaves the other
  ranks' running statistics behind; DDP's buffer broadcast masking running
  statistics that differ across ranks (PR #46636 never landed, #63917);
- the reducer's variants: static graph, unused-parameter search, gradients
  as bucket views, one bucket per parameter, ``no_sync`` accumulation;
- the seed of this project: apex's SyncBN under DDP crashing in
  ``all_gather`` between two PyTorch commits (8066fba, b05c342);
- SyncBN under DDP over a backend with the list all_gather only (MPI's
  kind): a flat all_gather refused there (pytorch#85628, the review of
  pytorch#104250).

Each case trains the network (Conv -> SyncBN -> ReLU -> Conv -> SyncBN ->
pool -> Linear, or a residual block) for 5 optimizer steps on uneven per-rank
batches, then evaluates once, and is compared after every step with a float64
network over the global batch (parameters, optimizer state, every rank's
buffers, the all-reduced gradients); those must also be bitwise the same on
every rank. The default selection is a pairwise covering subset of the
flags' product; ``--exhaustive`` runs all of it.
"""

import dataclasses

from harness.catalog.case import Case
from harness.catalog import covering

FAMILY = "ddp"

NETWORKS = (("cnn", "sgd"), ("resblock", "sgd"), ("cnn", "adam"))
BUFFERS = ("broadcast_buffers=True", "broadcast_buffers=False", "forward_sync_buffers=False")
REDUCER = ("default", "static_graph", "find_unused_parameters", "gradient_as_bucket_view", "bucket_cap_mb=0.0001")
EXTRAS = ("plain", "no_sync=2", "checkpoint-rank0")
STEPS = 5


def _case(net, buffers, reducer, extra, default, dtype="float32", batches=(3, 5)) -> Case:
    model, optimizer = net
    flags = ["ddp"] + [f for f in (buffers, reducer, extra) if f not in ("broadcast_buffers=True", "default", "plain")]
    micro = 2 if extra == "no_sync=2" else 1
    ws = len(batches)
    name = "-".join(f.replace("=", "-").replace("_", "-") for f in (buffers, reducer, extra))
    return Case(id=f"{FAMILY}/{model}-{optimizer}/{name}/{dtype}/ws{ws}", family=FAMILY, batch_sizes=batches,
                spatial=((4, 4),) * ws, channels=3, dtype=dtype, param_dtype=dtype, scenario="model", model=model,
                optimizer=optimizer, ddp=tuple(flags), steps=("train",) * (STEPS * micro) + ("eval",),
                default=default)


TWO_FORWARDS_DEFAULT = (("broadcast_buffers=True", "default"), ("broadcast_buffers=False", "static_graph"))


def _two_forwards(buffers, reducer, default) -> Case:
    """The first network under DDP, each optimizer step two forwards then one backward of both losses."""
    base = _case(NETWORKS[0], buffers, reducer, "plain", default)
    name = "-".join(f.replace("=", "-").replace("_", "-") for f in (buffers, reducer)) + "-two-forwards"
    return dataclasses.replace(base, id=f"{FAMILY}/cnn-sgd/{name}/float32/ws2", seed=-1,
                               steps=("fwd", "train") * STEPS + ("eval",))


def cases() -> list[Case]:
    out = [_case(*values, default) for values, default in covering.product(NETWORKS, BUFFERS, REDUCER, EXTRAS)]
    # float64 end to end, three ranks: the same arithmetic with nothing left to rounding.
    out.append(_case(NETWORKS[0], BUFFERS[0], REDUCER[0], EXTRAS[0], True, dtype="float64", batches=(2, 4, 3)))
    # Two forwards (a fwd step, then a train step) before one backward of the sum, as GAN discriminators train
    # (pytorch#175024): DDP's buffer broadcast runs before each forward. Every buffer and reducer option, the
    # first network; two by default.
    for values, _ in covering.product(BUFFERS, REDUCER):
        out.append(_two_forwards(*values, default=values in TWO_FORWARDS_DEFAULT))
    # Over a backend with the list all_gather only (MPI's kind): DDP's own collectives work there, SyncBN's must.
    out.append(_case(NETWORKS[0], BUFFERS[0], REDUCER[0], EXTRAS[0], True).on_backend("list-contract"))
    return out
