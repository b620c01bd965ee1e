"""training-loop: SyncBN as a training loop drives it, step after step, beyond one forward and one backward.

Catches:
- two forwards before one backward (GAN discriminators): statistics or saved
  tensors of the first forward overwritten by the second, so its gradient is
  wrong or the backward fails (pytorch#175024, #22095, #65907, #110363);
- a last batch of an epoch smaller than the others: a running variance
  corrected with a count kept from an earlier step (pytorch#22192);
- evaluation on rank 0 alone while the others wait: a collective issued in
  eval hangs validation (pytorch#48988, #54059, #61481, #56982); here it fails
  at once and is attributed;
- a training-mode forward under ``torch.no_grad()`` (statistics still
  updated, no graph);
- several SyncBN layers of one width: state shared or cached per width;
- inputs that are permuted or sliced views, dense in no memory format, read
  as if contiguous (pytorch#62967, #63224);
- widths of real networks (256 to 2048 channels: ResNet-50's last stage is
  2048 wide) where kernels go wrong (apex#1768, pytorch#57077);
- forward that writes into its input, or returns an output aliasing it
  (checked in every case of every layer family).

The generated matrix crosses every variant with the dtype combinations and
per-rank batch layouts (world sizes 2, 3, 4, an empty rank); the default
selection is a pairwise covering subset, ``--exhaustive`` the full product.
"""

from harness.catalog.case import Case
from harness.catalog import covering

FAMILY = "training-loop"

VARIANTS = (
    ("two-forwards", {"steps": ("fwd", "train", "fwd", "train")}),
    ("last-batch-smaller", {"steps": ("train", "train", "train"), "shrink_last": True}),
    ("eval-on-rank0", {"steps": ("train", "eval-rank0", "train")}),
    ("nograd-forward", {"steps": ("train", "nograd", "train")}),
    ("permuted-input", {"steps": ("train", "eval"), "input_layout": "permuted"}),
    ("sliced-input", {"steps": ("train", "train"), "input_layout": "sliced"}),
    ("layers-one-width", {"steps": ("train", "train", "eval"), "scenario": "model", "model": "bn-chain"}),
    ("width-256", {"channels": 256, "spatial": (2, 2)}),
    ("width-512", {"channels": 512, "spatial": (2, 2)}),
    ("width-1024", {"channels": 1024, "spatial": (2, 2)}),
    ("width-2048", {"channels": 2048, "spatial": (1, 2)}),
)
DTYPES = (("float32", "float32"), ("float16", "float32"), ("bfloat16", "float32"), ("float64", "float64"))
LAYOUTS = (("uneven-3-5", (3, 5)), ("empty-2-0-3", (2, 0, 3)), ("uneven-1-2-1-3", (1, 2, 1, 3)))


def _case(variant: str, spec: dict, dtypes: tuple, layout: tuple, default: bool) -> Case:
    (dtype, pdtype), (lname, batches) = dtypes, layout
    spec = dict(spec)
    spatial = spec.pop("spatial", (4, 3))
    steps = spec.pop("steps", ("train",))
    if spec.pop("shrink_last", False):
        spec["step_batch_sizes"] = (batches,) * (len(steps) - 1) + (tuple((b + 1) // 2 for b in batches),)
    ws = len(batches)
    return Case(id=f"{FAMILY}/{variant}/{dtype}-{pdtype}/{lname}/ws{ws}", family=FAMILY, batch_sizes=batches,
                spatial=(spatial,) * ws, dtype=dtype, param_dtype=pdtype, steps=steps, default=default,
                channels=spec.pop("channels", 6), input_mean=0.5, **spec)


def cases() -> list[Case]:
    return [_case(*variant, dtypes, layout, default)
            for (variant, dtypes, layout), default in covering.product(VARIANTS, DTYPES, LAYOUTS)]
