"""no-group: SyncBN in a process where torch.distributed was never initialized, judged as nn.BatchNorm there.

Catches:
- a SyncBN that needs a process group to train where none exists (pytorch#63662: "Default process group has
  not been initialized"; fixed by pytorch#89706, merged 2022-11, which falls back to the framework's batch norm;
  detectron2#3972: the same error from a one-GPU detectron2 run);
- one that needs it to evaluate (pytorch#22538, fixed by pytorch#24815), or that reads the world size, the
  group or a collective in eval or when making a program of the model;
- a model holding SyncBN that cannot be evaluated, ``torch.jit.trace``d or ``torch.export``ed in a single
  process, or whose traced or exported program computes something else (pytorch#82464).

Every case has one rank and ``backend="no-group"``: the rank process never calls ``init_process_group``, so
``torch.distributed.is_initialized()`` is False there, as in a user's script run without a launcher, and any
collective raises. What a user expects, and torch does since pytorch#89706 (its forward synchronizes only when
``torch.distributed`` is initialized and the group has more than one rank): nn.BatchNorm over the local batch. The
oracle of a one-rank case is exactly that.

Each implementation was read for what it does without a process group: torch (2.13), the reference, apex's
Python fallback (``torch.distributed.is_initialized()`` checked before any collective), detectron2's
``NaiveSyncBatchNorm`` (``comm.get_world_size()`` is 1 without a group: plain ``BatchNorm2d``) and fairscale's
SyncBatchNorm (plain BatchNorm unless initialized) all fall back to the local batch, and none documents an error
there, so every one is judged by nn.BatchNorm's semantics; no implementation is excused.

Two kinds of case:
- ``layer``: one layer built directly (``SyncBatchNorm(C)``, no converter), trained two steps and evaluated
  (:mod:`harness.scenarios.layer`), over its configuration (momentum, running statistics, affine), dtypes and
  input (2-D, 4-D, channels_last); a pairwise covering array by default (half input never with momentum=None,
  a pair the catalog leaves to search);
- ``model``: a model converted with the implementation's converter (process group None), trained two steps,
  then evaluated, traced and exported on CPU as shipped (:mod:`harness.scenarios.inference`).
"""

import itertools

from harness.catalog import covering
from harness.catalog.case import NO_GROUP, Case

FAMILY = "no-group"

CONFIGS = {"default": {}, "momentum-none": {"momentum": None}, "no-running-stats": {"track_running_stats": False},
           "affine-off": {"affine": False}}
DTYPES = {"float32": ("float32", "float32"), "float64": ("float64", "float64"),
          "float16-float32": ("float16", "float32")}
INPUTS = {"2d": ((), "contiguous"), "4d": ((3, 2), "contiguous"), "4d-channels_last": ((3, 2), "channels_last")}
# The inference scenario's models whose conversion asks nothing of a converter beyond swapping the class (the
# conversion family judges the rest): non-default eps, momentum, momentum=None and affine=False; a frozen layer
# inside; batch statistics in eval.
MODELS = ("config", "frozen", "no-running-stats")
MODEL_DTYPES = ("float32", "float64")
DEFAULT_MODELS = {("config", "float32"), ("frozen", "float64"), ("no-running-stats", "float32")}


def _layer(config: str, dtypes: str, shape: str, default: bool) -> Case:
    dtype, param_dtype = DTYPES[dtypes]
    spatial, fmt = INPUTS[shape]
    return Case(id=f"{FAMILY}/layer/{config}/{dtypes}/{shape}/ws1/{NO_GROUP}", family=FAMILY, batch_sizes=(5,),
                spatial=(spatial,), dtype=dtype, param_dtype=param_dtype, memory_format=fmt,
                steps=("train", "train", "eval"), backend=NO_GROUP, default=default, **CONFIGS[config])


def _model(model: str, dtype: str) -> Case:
    return Case(id=f"{FAMILY}/model/{model}/{dtype}/ws1/{NO_GROUP}", family=FAMILY, batch_sizes=(6,),
                spatial=((3, 2),), dtype=dtype, param_dtype=dtype, channels=6, steps=("train", "train", "eval"),
                scenario="inference", model=model, input_mean=0.5, backend=NO_GROUP,
                default=(model, dtype) in DEFAULT_MODELS)


def _allowed(config: str, dtypes: str, shape: str) -> tuple:
    """The row, its half input swapped for float64 where it meets momentum=None: the catalog never has the two
    together, a pair left to search (tests/support/search_defects.py, HalfInputCumulativeAverage)."""
    return (config, "float64" if config == "momentum-none" and dtypes.startswith("float16") else dtypes, shape)


def cases() -> list[Case]:
    factors = [list(CONFIGS), list(DTYPES), list(INPUTS)]
    default = {_allowed(*row) for row in covering.pairwise(factors)}  # still covers every pair it may
    rows = [row for row in itertools.product(*factors) if _allowed(*row) == row]
    out = [_layer(*row, row in default) for row in rows]
    return out + [_model(m, d) for m in MODELS for d in MODEL_DTYPES]
