"""allgather-shape: ranks whose collective operands or counts differ, crossed with dtypes and layouts.

Catches:
- statistics merged with equal weights instead of per-rank counts, and the
  running variance updated with a per-rank count (pytorch#22192, inplace_abn#68,
  apex#387; fixed in torch by pytorch#22248);
- a backward that divides by the world size instead of the global count when
  batches are uneven (pytorch#36382: "wrong dgrad");
- ranks with an empty batch: a crash in batch_norm_stats, NaN poisoning the
  merge, or peers hung in the all_gather (pytorch#36530, detectron2#366,
  detectron2#1807; fixed by pytorch#74944), including the zero row sent in a
  different dtype from the other ranks' (the worry raised in pytorch#37198);
- all_gather operands of different sizes or dtypes across ranks (the 2020 break
  of apex.parallel.SyncBatchNorm between pytorch#40358 and pytorch#40573:
  "All tensor operands to scatter/gather must have the same size");
- one sample per rank rejected although the global batch is larger
  (pytorch#36865, apex#262);
- different spatial sizes per rank (a count taken from N instead of N*H*W,
  pytorch#22192);
- a flat all_gather (``all_gather_into_tensor``) on a backend that has only
  the list one, as MPI's and some third-party accelerators' groups
  (pytorch#85628; the review of pytorch#104250, where torch's SyncBatchNorm
  took the flat gather on every backend not named gloo): list-contract twins.

The generated matrix crosses every batch layout below (world sizes 2, 3 and 4)
with every dtype combination, memory format and process-group backend (the
run's, and nccl-contract: torch's non-gloo code path on CPU); the default
selection is a pairwise covering subset of it (harness.covering),
``--exhaustive`` the full product. The nccl-contract twins of the default
selection have list-contract twins too (the same data), one of them default.
"""

from harness.catalog.case import Case
from harness.catalog.covering import covering_levels, pairwise

FAMILY = "allgather-shape"

LAYOUTS = (
    ("even-4-4", (4, 4)),
    ("uneven-2-6", (2, 6)),
    ("empty-0-5", (0, 5)),
    ("one-1-1", (1, 1)),
    ("uneven-1-2-5", (1, 2, 5)),
    ("empty-3-0-2", (3, 0, 2)),
    ("uneven-3-1-4-2", (3, 1, 4, 2)),
    ("empties-0-3-0-2", (0, 3, 0, 2)),
)
DTYPES = (
    ("float32", "float32"),
    ("float16", "float32"),
    ("bfloat16", "float32"),
    ("float16", "float16"),
    ("bfloat16", "bfloat16"),
    ("float64", "float64"),
)
FORMATS = (
    ("contiguous", (4, 3)),
    ("channels_last", (4, 3)),
    ("channels_last_3d", (3, 2, 2)),
)


# The process-group backend: the run's (gloo on CPU), or nccl-contract, where torch's SyncBatchNorm takes the
# flat all_gather that nccl and every other non-gloo backend get (see harness.engine.nccl_contract).
BACKENDS = (None, "nccl-contract")


def matrix() -> list[Case]:
    """The full product; the pairwise covering rows are marked default.

    The run's backend keeps the pairwise rows of (layout, dtype, format); each further backend is paired
    with every value of those three factors by a few twins of those rows (``covering_levels``), so the
    backend factor is covered pairwise too without moving the run-backend rows.
    """
    factors = [range(len(LAYOUTS)), range(len(DTYPES)), range(len(FORMATS))]
    base = pairwise(factors)
    covering = {row + (0,) for row in base}
    covering |= {row + (bi,) for bi in range(1, len(BACKENDS)) for row in covering_levels(base)}
    out = []
    for li, (layout, batches) in enumerate(LAYOUTS):
        for di, (dtype, pdtype) in enumerate(DTYPES):
            for fi, (fmt, spatial) in enumerate(FORMATS):
                ws = len(batches)
                case = Case(
                    id=f"{FAMILY}/{layout}/{dtype}-{pdtype}/{fmt}/ws{ws}", family=FAMILY, batch_sizes=batches,
                    spatial=(spatial,) * ws, dtype=dtype, param_dtype=pdtype, memory_format=fmt, channels=5,
                    input_mean=0.5, input_scale=2.0, default=(li, di, fi, 0) in covering)
                out.append(case)
                for bi, backend in enumerate(BACKENDS[1:], start=1):
                    out.append(case.on_backend(backend, default=(li, di, fi, bi) in covering))
    return out


# A backend with the list all_gather only (see harness.engine.list_contract): twins of the default nccl-contract rows,
# so it meets every layout, dtype combination and memory format. One by default: a layer that takes the flat gather
# there fails every one alike, and each such failure (raised inside torch.distributed) costs a restart of the pool.
LIST_ONLY = "list-contract"
LIST_ONLY_DEFAULT = f"{FAMILY}/even-4-4/float32-float32/contiguous/ws2"


def cases() -> list[Case]:
    grid = matrix()
    gloo = {c.id: c for c in grid if c.backend is None}
    twins = [gloo[c.id.rsplit("/", 1)[0]].on_backend(LIST_ONLY, default=c.id.startswith(LIST_ONLY_DEFAULT + "/"))
             for c in grid if c.backend == BACKENDS[1] and c.default]
    return grid + twins + [
        Case(id=f"{FAMILY}/spatial-differs/ws2", family=FAMILY, batch_sizes=(3, 3), spatial=((4, 3), (2, 5))),
        Case(id=f"{FAMILY}/spatial-differs-empty/ws3", family=FAMILY, batch_sizes=(2, 0, 1),
             spatial=((5, 1), (3, 3), (2, 7))),
        Case(id=f"{FAMILY}/uneven-steps-3-1/ws2", family=FAMILY, batch_sizes=(3, 1), spatial=((4, 3),) * 2,
             steps=("train", "train", "eval")),
        Case(id=f"{FAMILY}/one-sample-2d/ws2", family=FAMILY, batch_sizes=(1, 1), spatial=((),) * 2),
    ]
