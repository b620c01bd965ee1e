"""inference: a converted model trained on CPU ranks, then evaluated, traced and exported on CPU as shipped.

Catches:
- a converted model whose SyncBN refuses CPU input in evaluation or under ``torch.jit.trace`` after training
  ("SyncBatchNorm expected input tensor to be on GPU": pytorch#82464, a CPU trace in the training process;
  yolov5#1018, an ONNX export on CPU; mmsegmentation#387, CPU inference of a SyncBN config);
- evaluation that synchronizes, or reads the process group, once training is over (pytorch#22538);
- a traced or exported program that computes something else than the model it was made from (a value of the
  example batch baked in, statistics of the batch where the running ones belong);
- evaluation, tracing or export that moves the running statistics.

Each case converts a model of :mod:`harness.scenarios.user_models` with the implementation's converter over the
whole world, trains it two steps on the ranks (on CPU: torch in cpu-emulation), then rank 0 takes the trained
model to CPU with its layers as shipped (nothing of the harness answers torch's device check there) and runs its
own batch eagerly, through ``torch.jit.trace`` and through ``torch.export.export``
(:mod:`harness.scenarios.inference`): every output against the unconverted model in float64 in eval mode, with
the same running statistics. The same inference in a process without a process group is the ``no-group``
family's. The product (model x dtype x batch layout) is ``--exhaustive``; the default selection is a pairwise
covering subset.
"""

from harness.catalog import covering
from harness.catalog.case import Case

FAMILY = "inference"

# The models whose conversion asks nothing of a converter beyond swapping the class (the conversion family judges
# the rest): non-default eps, momentum, momentum=None and affine=False; a frozen layer inside; batch statistics in
# eval.
MODELS = ("config", "frozen", "no-running-stats")
LAYOUTS = (("uneven-3-5", (3, 5)), ("uneven-2-1-4", (2, 1, 4)))
DTYPES = ("float32", "float64")


def _case(model: str, layout: tuple, dtype: str, default: bool) -> Case:
    name, batches = layout
    ws = len(batches)
    return Case(id=f"{FAMILY}/{model}/{dtype}/{name}/ws{ws}", family=FAMILY, batch_sizes=batches,
                spatial=((3, 2),) * ws, dtype=dtype, param_dtype=dtype, channels=6, steps=("train", "train", "eval"),
                scenario="inference", model=model, input_mean=0.5, default=default)


def cases() -> list[Case]:
    return [_case(*values, default) for values, default in covering.product(MODELS, LAYOUTS, DTYPES)]
