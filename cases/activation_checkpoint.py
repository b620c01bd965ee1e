"""activation-checkpoint: ``torch.utils.checkpoint`` around SyncBN layers or around a whole block.

Catches (pytorch#96136, #43946):
- the forward recomputed in backward updates the running statistics a second
  time: ``num_batches_tracked`` advances by 2 per step and the statistics
  move twice (``nn.BatchNorm`` does the same: checkpointing is unaware of
  buffers, so the oracle, which expects checkpointing to change nothing,
  reports it for every implementation);
- the recomputation issues SyncBN's all_gather again inside backward, where a
  rank whose recomputation differs desynchronizes the group;
- gradients from the recomputed statistics differing from the first forward's.

Reentrant (``use_reentrant=True``) and non-reentrant checkpointing, around
every SyncBN layer and around the whole network, cross two networks, DDP or
none and two dtypes; the default selection is pairwise. Judged as the model
scenario judges: every tensor against the float64 network without
checkpointing.
"""

from harness.catalog import covering
from harness.catalog.case import CHECKPOINT_USES, Case

FAMILY = "activation-checkpoint"

USES = CHECKPOINT_USES  # the catalog's names and order (the covering array's rows follow it)
NETWORKS = ("cnn", "resblock")
WRAPS = (("local", ()), ("ddp", ("ddp",)))
DTYPES = ("float32", "float64")


def _case(use: str, net: str, wrap: tuple, dtype: str, default: bool) -> Case:
    wname, ddp = wrap
    where = use.removeprefix("checkpoint-")
    return Case(id=f"{FAMILY}/{where}/{net}/{wname}/{dtype}/ws2", family=FAMILY, batch_sizes=(3, 5),
                spatial=((4, 4),) * 2, channels=3, dtype=dtype, param_dtype=dtype, scenario="model", model=net,
                optimizer="sgd" if ddp else None, ddp=ddp, steps=("train", "train", "eval"), use=use, default=default)


def cases() -> list[Case]:
    return [_case(*values, default) for values, default in covering.product(USES, NETWORKS, WRAPS, DTYPES)]
