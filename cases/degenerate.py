"""degenerate: global batches at the edge of what batch normalization can do, judged by ``nn.BatchNorm``.

Catches an implementation that departs from ``nn.BatchNorm`` over the same
global batch, which the oracle follows:
- a training step in which every rank of the group is empty outputs nothing,
  gives zero gradients, counts the step in ``num_batches_tracked`` and leaves
  the running statistics as they were. torch's SyncBatchNorm instead moves
  them toward a mean of 0 and an infinite variance (pytorch#36530 asked for
  no update);
- a training step with one value per channel in the whole group is refused:
  ``nn.BatchNorm`` raises "Expected more than 1 value per channel when
  training". torch's SyncBatchNorm accepts it and makes ``running_var`` inf
  (the check of pytorch#37133 was removed by #46906);
- one rank holding a single value in a larger group is an ordinary step,
  down to two values in the whole group (the unbiased variance's n / (n - 1)
  at its largest, 2).

Each variant is crossed with three dtype combinations and both momentum
rules (0.1, and None: the cumulative average, whose factor counts the empty
step), but never half input with momentum=None: that pair is left to
``search`` (a planted defect needs exactly it, tests/support/search_defects.py).
"""

from harness.catalog.case import Case

FAMILY = "degenerate"

# (name, per-rank batch sizes per step, spatial, steps)
VARIANTS = (
    ("all-empty-step", ((3, 2), (0, 0), (2, 3)), (3, 2), ("train", "train", "train")),
    ("all-empty-then-eval", ((3, 2), (0, 0), (2, 3)), (3, 2), ("train", "train", "eval")),
    ("all-empty-ws3", ((2, 1, 2), (0, 0, 0), (1, 2, 2)), (2, 2), ("train", "train", "train")),
    ("one-value-1d", ((1, 0),), (), ("train",)),
    ("one-value-2d", ((0, 1),), (1, 1), ("train",)),
    ("one-value-after-train", ((2, 3), (1, 0)), (), ("train", "train")),
    ("single-value-rank", ((1, 3), (1, 3)), (), ("train", "train")),
    ("two-values-in-group", ((1, 1), (1, 1)), (), ("train", "eval")),
)
DTYPES = (("float32", "float32"), ("float16", "float32"), ("float64", "float64"))
MOMENTA = (("momentum-0.1", 0.1), ("momentum-none", None))


def _case(variant: tuple, dtypes: tuple, momentum: tuple, default: bool) -> Case:
    name, sizes, spatial, steps = variant
    (dtype, pdtype), (mname, m) = dtypes, momentum
    ws = len(sizes[0])
    return Case(id=f"{FAMILY}/{name}/{dtype}-{pdtype}/{mname}/ws{ws}", family=FAMILY, batch_sizes=sizes[0],
                spatial=(spatial,) * ws, channels=5, dtype=dtype, param_dtype=pdtype, momentum=m, steps=steps,
                step_batch_sizes=sizes if len(sizes) > 1 else None, input_mean=0.5, default=default)


COMBOS = tuple((d, m) for d in DTYPES for m in MOMENTA if not (d[0] == "float16" and m[1] is None))


def cases() -> list[Case]:
    # Default: each variant with two of the five combinations, in turn, so every combination meets several
    # variants (a pairwise array of two factors would be the whole product).
    return [_case(VARIANTS[v], *COMBOS[c], (2 * v + c) % len(COMBOS) in (0, 1))
            for v in range(len(VARIANTS)) for c in range(len(COMBOS))]
