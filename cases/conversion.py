"""conversion: what users do to a model before SyncBN, judged by the model they converted.

Catches:
- the training flag dropped in conversion (pytorch PR #111998, mmengine#1624,
  timm#2422): a frozen, eval-mode BatchNorm starts updating its statistics;
- BatchNorm subclasses with extra behaviour silently replaced by a plain
  SyncBN (pytorch#187298, PR #187771, timm#1254: a fused activation
  disappears);
- ``requires_grad`` reset on frozen parameters (pytorch#22569);
- ``qconfig`` lost (pytorch#45317);
- parameters copied instead of shared, and a module registered at two places
  turned into two modules;
- lazy BatchNorms converted before their first input (a SyncBN of width 0);
- non-default eps, momentum, momentum=None, affine=False and
  track_running_stats=False not carried over.

Each case converts one model of :mod:`harness.scenarios.user_models` with the
implementation's converter and runs it for two training steps and an eval step
(two training steps for ``no-running-stats``, whose eval normalizes each rank's
batch by itself), against the unconverted model in float64 on the global
batch. The full product (model x batch layout x dtype) is ``--exhaustive``; the
default selection is a pairwise covering subset.
"""

from harness.catalog.case import CHECKPOINT_MODES as CHECKPOINTS
from harness.catalog.case import CONVERSION_MODELS as MODELS
from harness.catalog.case import Case
from harness.catalog import covering

FAMILY = "conversion"

LAYOUTS = (("uneven-3-5", (3, 5)), ("uneven-2-1-4", (2, 1, 4)), ("empty-2-0-3", (2, 0, 3)))
DTYPES = ("float32", "float64")


def _case(model: str, layout: tuple, dtype: str, default: bool) -> Case:
    name, batches = layout
    ws = len(batches)
    steps = ("train", "train") if model == "no-running-stats" else ("train", "train", "eval")
    return Case(id=f"{FAMILY}/{model}/{dtype}/{name}/ws{ws}", family=FAMILY, batch_sizes=batches,
                spatial=((3, 2),) * ws, dtype=dtype, param_dtype=dtype, channels=6, steps=steps,
                scenario="conversion", model=model, input_mean=0.5, default=default)


def _round_trip(mode: str, model: str, dtype: str, default: bool) -> Case:
    batches = (3, 1, 4) if mode != "revert" and mode != "rank0-ddp" else (3, 5)
    ws = len(batches)
    return Case(id=f"{FAMILY}/checkpoint-{mode}/{model}/{dtype}/ws{ws}", family=FAMILY, batch_sizes=batches,
                spatial=((3, 2),) * ws, dtype=dtype, param_dtype=dtype, channels=6,
                steps=("train", "train", "train", "eval"), scenario="checkpoint", model=model, checkpoint=mode,
                input_mean=0.5, default=default)


def cases() -> list[Case]:
    out = [_case(*values, default) for values, default in covering.product(MODELS, LAYOUTS, DTYPES)]
    # Checkpoint round trips: every mode by default on a model torch's converter handles (config) and on one
    # that needs a faithful converter (nested); float64 in --exhaustive.
    for mode in CHECKPOINTS:
        for model in ("config", "nested"):
            for dtype in DTYPES:
                out.append(_round_trip(mode, model, dtype, default=dtype == "float32"))
    return out
