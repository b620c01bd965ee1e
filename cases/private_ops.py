"""private-ops: torch's five private SyncBN ops, each called on fixed inputs (the private_ops scenario).

Code outside torch calls ``torch.batch_norm_stats``, ``torch.batch_norm_gather_stats_with_counts``,
``torch.batch_norm_elemt``, ``torch.batch_norm_backward_reduce`` and ``torch.batch_norm_backward_elemt`` itself
(horovod's SyncBN, apex, detectron2). A case calls one op on each rank and judges every output against the op's
float64 contract (harness/judge/private_ops.py), so that ``syncbn-harness diff`` between two builds names the op
whose schema or results changed.

Catches:
- a changed schema that breaks callers outside torch: horovod's SyncBN raised after torch 1.5 and 1.9 changed
  the ops' signatures (horovod#1980, pytorch#57900); here a ``TypeError``, an error record;
- a changed dtype contract: the counts' dtype the gather reads (pytorch#98332, after pytorch#96203), the
  statistics of half and bfloat16 input in float32, outputs in the input's dtype;
- half partial sums in ``batch_norm_backward_reduce``: gradients scaled by 2**16 (AMP's loss scale) with a
  non-zero mean overflow half in CUDA's contiguous kernel (pytorch#195701; pytorch#196125 keeps them in float);
- a gathered row of count 0 (an empty rank's, passed on under CUDA graph capture) given weight in the merge: NaN
  (pytorch#78656);
- counts in float16 whose sum passes 65,504: a merged mean of 0 (pytorch#70901);
- what an empty input gives ``batch_norm_stats``: mean 0 and invstd NaN.
"""

from harness.catalog.case import PRIVATE_OPS, Case
from harness.catalog.covering import product

FAMILY = "private-ops"
DTYPES = (("float32", "float32"), ("float16", "float32"), ("bfloat16", "float32"))


def _case(op: str, variant: str, dtypes: tuple, batch_sizes=(3, 5), spatial=(4, 3), channels=6, options=(),
          default=True, note="") -> Case:
    ws = len(batch_sizes)
    return Case(id=f"{FAMILY}/{op}/{variant}/{dtypes[0]}-{dtypes[1]}/ws{ws}", family=FAMILY,
                batch_sizes=tuple(batch_sizes), spatial=(tuple(spatial),) * ws, channels=channels,
                dtype=dtypes[0], param_dtype=dtypes[1], scenario="private_ops", op=(op, *options),
                default=default, note=note)


def cases() -> list[Case]:
    out = [_case(op, "plain", dtypes, default=default) for (op, dtypes), default in product(PRIVATE_OPS, DTYPES)]
    f32, f16 = DTYPES[0], ("float16", "float16")
    out += [
        _case("batch_norm_stats", "empty-rank", f32, batch_sizes=(0, 5), spatial=(),
              note="an empty 2-D input: mean 0, invstd NaN"),
        _case("batch_norm_gather_stats_with_counts", "empty-rank", f32, batch_sizes=(0, 4, 6),
              note="an empty rank's zero row of count 0 first among the rows (pytorch#78656)"),
        _case("batch_norm_gather_stats_with_counts", "counts-past-65504", f16, batch_sizes=(40, 40),
              spatial=(32, 32), channels=2, note="float16 counts 40,960 + 40,960 (pytorch#70901)"),
        _case("batch_norm_backward_reduce", "loss-scaled", DTYPES[1], batch_sizes=(16, 16), spatial=(8, 16),
              channels=4, options=("loss-scaled",),
              note="float16 gradients scaled by 2**16, mean 128, 2,048 values per channel (pytorch#195701)"),
    ]
    return out
