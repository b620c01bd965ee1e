"""compile: SyncBN under ``torch.compile``, against the same run in eager mode and the float64 oracle.

Catches:
- dynamo unable to trace SyncBN (pytorch#107372): graph breaks inside the
  layer, counted per rank with their reasons, so a new break (or one gone)
  shows between two builds;
- ``fullgraph=True`` refused: first at ``is_current_stream_capturing``, then at
  ``batch_norm_gather_stats_with_counts`` (#156680), graph breaks on SyncBN
  (#161302), ``momentum=None`` through ``.item()`` (#194504): a fullgraph case
  is an ``error`` with dynamo's reason until a build compiles it;
- compiled code that computes something else than eager: with the ``eager``
  backend anything but bitwise equality with the eager run fails; ``aot_eager``
  and ``inductor`` are judged against the oracle, their difference from eager
  reported;
- DDP around a model with converted SyncBN layers, compiled (DDPOptimizer
  splitting the graph at bucket boundaries; #100239);
- recompiles when the per-rank batch changes from step to step (automatic
  dynamic shapes) or the module switches between train and eval.

Targets: one layer (also with ``momentum=None`` and with float16 input and
float32 parameters), a chain of three SyncBN layers, and the convolutional
network under DDP with SGD. Each runs over several steps with uneven per-rank
batches that change between steps, under every backend (``eager``,
``aot_eager``, ``inductor``), ``fullgraph`` off and on, ``dynamic`` left to
dynamo or ``True``. Inductor's first compile of a case takes tens of seconds
on two cores, so the default selection is a pairwise covering subset over the
``eager`` and ``aot_eager`` backends plus one inductor case; ``--exhaustive``
runs the full product.
"""

from harness.catalog.case import Case
from harness.catalog.covering import pairwise

FAMILY = "compile"

SIZES = ((3, 5), (5, 2), (4, 4), (2, 6))  # per step: every rank's batch changes, and rank 0's gets larger
TARGETS = (
    ("layer", {"steps": ("train", "train", "eval", "train")}),
    ("layer-momentum-none", {"steps": ("train", "train", "eval", "train"), "momentum": None}),
    ("layer-float16", {"steps": ("train", "train", "eval", "train"), "dtype": "float16"}),
    ("bn-chain", {"steps": ("train", "train", "eval"), "scenario": "model", "model": "bn-chain"}),
    ("ddp-cnn", {"steps": ("train", "train", "train", "eval"), "scenario": "model", "model": "cnn",
                 "ddp": ("ddp",), "optimizer": "sgd", "channels": 3}),
)
BACKENDS = ("eager", "aot_eager", "inductor")
FULLGRAPH = (False, True)
DYNAMIC = (False, True)


def _case(target: str, spec: dict, backend: str, fullgraph: bool, dynamic: bool, default: bool) -> Case:
    spec = dict(spec)
    steps = spec.pop("steps")
    flags = (backend,) + (("fullgraph",) if fullgraph else ()) + (("dynamic",) if dynamic else ())
    name = f"{backend}/{'fullgraph' if fullgraph else 'breaks-allowed'}/{'dynamic' if dynamic else 'auto-dynamic'}"
    return Case(id=f"{FAMILY}/{target}/{name}/ws2", family=FAMILY, batch_sizes=SIZES[0], spatial=((4, 3),) * 2,
                channels=spec.pop("channels", 6), steps=steps, step_batch_sizes=SIZES[:len(steps)],
                compile=flags, input_mean=0.5, default=default, **spec)


def cases() -> list[Case]:
    # Pairwise over the backends without inductor (each of those cases costs tens of seconds), then the one
    # inductor case of the default selection: the single layer as most users compile it.
    cheap = [range(len(TARGETS)), range(2), range(len(FULLGRAPH)), range(len(DYNAMIC))]
    covering = set(pairwise(cheap)) | {(0, 2, 0, 0)}
    return [_case(*TARGETS[t], BACKENDS[b], FULLGRAPH[f], DYNAMIC[d], (t, b, f, d) in covering)
            for t in range(len(TARGETS)) for b in range(len(BACKENDS)) for f in range(len(FULLGRAPH))
            for d in range(len(DYNAMIC))]
