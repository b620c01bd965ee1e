"""fsdp: SyncBN inside a small network sharded by FSDP2 (``fully_shard``) with mixed precision, trained.

Catches:
- SyncBN under a sharded data-parallel wrapper other than DDP failing or
  computing wrong statistics (Lightning#5210 and fairscale#489: "SyncBatchNorm
  is only supported within DistributedDataParallel" under sharded training);
- mixed precision applied to normalization layers by the sharding wrapper
  (pytorch#75478: FSDP's mixed precision broke BatchNorm and SyncBatchNorm,
  "Expected counts to have type Half but got Float"; FSDP2's recipe,
  torchtitan#674, keeps each normalization a unit of its own in float32):
  a layer that returns its float32 parameters' dtype hands the next, half,
  layer float32;
- running statistics left local, gradient shares wrong under FSDP2's
  reduce-scatter, as under DDP.

Each case shards the network (Conv -> SyncBN -> ReLU -> Conv -> SyncBN ->
pool -> Linear, or a residual block; SGD) with the ``fsdp2`` model option
(harness/scenarios/sharded.py): compute in bfloat16 or float16, parameters,
optimizer and gradient reduction in float32, every normalization a float32
unit of its own. 3 optimizer steps and an evaluation, judged as under autocast
against the float64 network over the global batch. A case costs about 2 s per
implementation on two cores (FSDP2's setup and sharded tensors), so the
default selection holds two (each network, each dtype; two ranks, whose pool
every default run starts anyway);
``--exhaustive`` runs the whole product, empty ranks included.
"""

from harness.catalog.case import Case
from harness.catalog import covering

FAMILY = "fsdp"

# SGD: Adam's step divides by the gradients' own scale, so half-precision rounding of a near-zero gradient moves a
# parameter by a whole learning rate, past any budget the network's rounding gives (seen on the residual block).
NETWORKS = (("cnn", "sgd"), ("resblock", "sgd"))
DTYPES = ("bfloat16", "float16")
LAYOUTS = (("uneven-3-5", (3, 5)), ("uneven-2-1-4", (2, 1, 4)), ("empty-2-0-3", (2, 0, 3)))
DEFAULT = ("fsdp/cnn-sgd/bfloat16/uneven-3-5/ws2", "fsdp/resblock-sgd/float16/uneven-3-5/ws2")


def _case(net: tuple, dtype: str, layout: tuple) -> Case:
    (model, optimizer), (lname, batches) = net, layout
    ws = len(batches)
    cid = f"{FAMILY}/{model}-{optimizer}/{dtype}/{lname}/ws{ws}"
    return Case(id=cid, family=FAMILY, batch_sizes=batches, spatial=((4, 4),) * ws, channels=3, dtype=dtype,
                param_dtype="float32", scenario="model", model=model, optimizer=optimizer, options=("fsdp2",),
                steps=("train",) * 3 + ("eval",), default=cid in DEFAULT)


def cases() -> list[Case]:
    return [_case(*values) for values, _ in covering.product(NETWORKS, DTYPES, LAYOUTS)]
