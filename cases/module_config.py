"""module-config: the module's options and modes.

Catches:
- affine=False (weight None) dereferenced, or gradients for absent parameters;
  an empty rank's backward that joins its peers' all_reduce only when the
  weight wants a gradient (the peers wait for it);
- track_running_stats=False still writing buffers or failing in the gather
  (pytorch#49730, fixed by pytorch#50126);
- momentum=None (cumulative average) treated as a fixed factor (pytorch#31498);
- eval mode that still synchronizes or uses batch statistics (pytorch#48988,
  pytorch#22538 / pytorch#24815);
- running statistics drifting over several steps, num_batches_tracked not
  counted;
- eps ignored, or added outside the square root;
- 2-D, 3-D and 5-D input (apex#194: SyncBatchNorm did not take 2-D input);
- bias=False (a weight without a bias, BatchNorm's keyword since pytorch#176573):
  the bias dereferenced, a bias gradient made up, or the keyword ignored (a
  layer that has a bias all the same). An implementation without the keyword
  reports these cases ``unsupported``;
- the layer as its constructor makes it: weight 1 and bias 0 (pytorch#12259:
  a weight drawn from U(0, 1)), running mean 0 and variance 1; made in place
  by ``device=`` and ``dtype=`` (the keywords refused, or ignored: pytorch#54508);
- ``track_running_stats`` switched off after construction, as users freeze
  statistics: training must leave the buffers alone and eval use them
  (pytorch#44445);
- a state dict without ``num_batches_tracked`` (hand-built or old) loaded into
  a trained layer: its count must stay, or momentum=None's average restarts
  (pytorch#110361); a layer built on the meta device and loaded with
  ``assign=True``: its count must become a real 0 (pytorch#115285);
- one channel, a rank holding one value: its input has a single element, and
  code that takes a one-element input for an empty one (``numel() > 1`` for
  ``> 0``) drops that rank from the statistics or its output.
"""

from harness.catalog.case import Case

FAMILY = "module-config"


def _case(name: str, batch_sizes=(3, 4), spatial=(4, 3), **kw) -> Case:
    ws = len(batch_sizes)
    return Case(id=f"{FAMILY}/{name}/ws{ws}", family=FAMILY, batch_sizes=tuple(batch_sizes),
                spatial=(tuple(spatial),) * ws, **kw)


def cases() -> list[Case]:
    return [
        _case("affine-off", affine=False),
        _case("affine-off-no-running-stats", affine=False, track_running_stats=False),
        _case("affine-off-empty-rank", batch_sizes=(0, 3, 2), affine=False, steps=("train", "train")),
        _case("no-running-stats", track_running_stats=False, steps=("train", "eval")),
        _case("momentum-none-3-steps", momentum=None, steps=("train", "train", "train")),
        _case("momentum-none-eval", momentum=None, steps=("train", "train", "eval")),
        _case("momentum-0.5", momentum=0.5, steps=("train", "train")),
        _case("train-eval-train", steps=("train", "eval", "train", "eval")),
        _case("eval-only", steps=("eval",)),
        _case("eps-1e-2", eps=1e-2, input_scale=0.1),
        _case("eps-0.5", eps=0.5),
        _case("input-2d", spatial=()),
        _case("input-2d-uneven", batch_sizes=(2, 7), spatial=()),
        _case("input-3d", spatial=(7,)),
        _case("input-5d", spatial=(2, 3, 2)),
        _case("input-5d-ws3", batch_sizes=(2, 1, 3), spatial=(2, 2, 2)),
        _case("bias-off", bias=False, steps=("train", "eval", "train")),
        _case("as-built", steps=("train", "eval"), setup="as-built"),
        _case("factory-float64", dtype="float64", param_dtype="float64", steps=("train", "eval"), setup="factory"),
        _case("stats-off-after", steps=("train", "eval", "train"), setup="stats-off-after"),
        _case("legacy-state-dict", momentum=None, steps=("train", "train", "eval"), setup="legacy-state-dict"),
        _case("meta-assign", momentum=None, steps=("train", "train", "eval"), setup="meta-assign"),
        _case("one-channel-one-value", batch_sizes=(1, 3), spatial=(), channels=1, steps=("train", "train")),
        _case("bias-off-momentum-none-5d", batch_sizes=(2, 0, 3), spatial=(2, 3, 2), bias=False, momentum=None,
              steps=("train", "train", "eval")),
    ]
