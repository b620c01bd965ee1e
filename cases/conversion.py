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
  track_running_stats=False not carried over;
- ``bias=False`` (BatchNorm's keyword since pytorch#176573: a weight, no
  bias) not carried over: the converted layer grows a bias;
- InstanceNorm (and any normalization of one sample at a time: GroupNorm,
  LayerNorm) converted to SyncBN (pytorch#29187, fixed by pytorch PR #29985;
  apex#437, fixed by apex PR #438);
- a revert to BatchNorm (the implementation's own: Lightning's
  ``TorchSyncBatchNorm.revert``, mmengine's ``revert_sync_batchnorm``; torch
  has none, pytorch#41081) that loses a frozen layer's eval mode (mmocr PR
  #453, the same fix in mmocr's copy), ``requires_grad``, ``affine=False``
  or ``bias=False`` (Lightning#21755, its revert with affine=False), or the
  statistics trained before it.

Each case converts one model of :mod:`harness.scenarios.user_models` with the
implementation's converter and runs it for two training steps and an eval step
(two training steps for ``no-running-stats``, whose eval normalizes each rank's
batch by itself), against the unconverted model in float64 on the global
batch. The full product (model x batch layout x dtype) is ``--exhaustive``; the
default selection is a pairwise covering subset. The models added later
(``no-bias``, ``other-norms``: :data:`MORE_MODELS`) are a product of their own,
so the first product's default rows stay as they were; ``other-norms`` takes
no empty rank (``nn.InstanceNorm`` itself refuses an empty batch). Cases
without bias carry ``bias=False``, so an implementation whose layer has no such
keyword reports them ``unsupported``.

``revert`` cases (``conversion/revert/...``, the revert scenario): the
``frozen``, ``config`` and ``no-bias`` models converted, trained a step over
the world, reverted by the implementation's own revert, then evaluated and
trained on each rank's own batch, against ``nn.BatchNorm`` on that batch.
"""

from harness.catalog.case import CHECKPOINT_MODES as CHECKPOINTS
from harness.catalog.case import CONVERSION_MODELS as MODELS
from harness.catalog.case import MORE_CONVERSION_MODELS as MORE_MODELS
from harness.catalog.case import Case
from harness.catalog import covering

FAMILY = "conversion"

LAYOUTS = (("uneven-3-5", (3, 5)), ("uneven-2-1-4", (2, 1, 4)), ("empty-2-0-3", (2, 0, 3)))
DTYPES = ("float32", "float64")
REVERTED = ("frozen", "config", "no-bias")  # the models of the revert cases


def _case(model: str, layout: tuple, dtype: str, default: bool) -> Case:
    name, batches = layout
    ws = len(batches)
    steps = ("train", "train") if model == "no-running-stats" else ("train", "train", "eval")
    return Case(id=f"{FAMILY}/{model}/{dtype}/{name}/ws{ws}", family=FAMILY, batch_sizes=batches,
                spatial=((3, 2),) * ws, dtype=dtype, param_dtype=dtype, channels=6, steps=steps,
                scenario="conversion", model=model, input_mean=0.5, default=default, bias=model != "no-bias")


def _revert(model: str, layout: tuple, dtype: str, default: bool) -> Case:
    """Step 0 converted, over the world; then, reverted, an eval step and a training step on each rank's batch."""
    name, batches = layout
    ws = len(batches)
    return Case(id=f"{FAMILY}/revert/{model}/{dtype}/{name}/ws{ws}", family=FAMILY, batch_sizes=batches,
                spatial=((3, 2),) * ws, dtype=dtype, param_dtype=dtype, channels=6, steps=("train", "eval", "train"),
                scenario="revert", model=model, input_mean=0.5, default=default, bias=model != "no-bias")


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
    # The later models: pairwise over the layouts with a rank of every batch, then no-bias with an empty rank.
    out += [_case(*values, default) for values, default in covering.product(MORE_MODELS, LAYOUTS[:2], DTYPES)]
    out += [_case("no-bias", LAYOUTS[2], dtype, default=dtype == "float32") for dtype in DTYPES]
    out += [_revert(*values, default) for values, default in covering.product(REVERTED, LAYOUTS[:2], DTYPES)]
    return out
