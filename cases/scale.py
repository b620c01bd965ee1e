"""scale: SyncBN at the shapes and per-GPU batch sizes networks train at.

The other families are toy-sized (at most 18,432 values per channel on a
rank); users normalize hundreds of thousands. Catches what only shows at
that size:
- counts past what a narrow type holds exactly (float16 integers stop at
  2,048; a bfloat16 count keeps 8 significant bits), and per-rank count
  bookkeeping that is only exercised with large, uneven counts;
- statistics accumulated in half, or in float32 one element at a time, whose
  error grows with the count (a sum of 400,000 values near 10 overflows
  float16's 65,504 by far);
- chunked or blocked reductions whose tail is dropped or whose partial results
  are merged with the wrong weights once a channel spans several blocks;
- widths of real networks (ResNet-50's 2048 channels) with real spatial sizes.

Shapes (per rank; world size 2, the split saying how the second rank's batch
relates to the first's): ResNet-50's stem (64 channels at 112x112, 32 images:
401,408 values per channel), its layer1 (64 and 256 channels at 56x56, 16
images: 50,176), its last stage (2048 channels at 7x7, 32 images), a
segmentation head at a quarter of 512x1024 (64 channels at 128x256, 2
images: 65,536) and a 3-D model's volume (32 channels at 64^3, one volume:
262,144). Every case trains twice, then evaluates. The judgement is the same
as everywhere (the float64 oracle, bounded in memory by its per-channel
reductions; tolerances from the dtype and the reduction size): no tolerance
is widened for size.

The full product (shape x dtype x memory format x split) is ``--exhaustive``;
the default selection takes four rows of the cheapest real shape (about 3
million values per rank, :data:`DEFAULT_ROWS`).
"""

from harness.catalog.case import Case

FAMILY = "scale"

# name -> (channels, spatial, images per rank)
SHAPES = (
    ("r50-layer1-64", 64, (56, 56), 16),
    ("r50-layer1-256", 256, (56, 56), 16),
    ("r50-stem", 64, (112, 112), 32),
    ("r50-layer4", 2048, (7, 7), 32),
    ("seg-512x1024", 64, (128, 256), 2),
    ("vol-64", 32, (64, 64, 64), 1),
)
DTYPES = (
    ("float32", "float32"),
    ("float16", "float32"),
    ("bfloat16", "float32"),
    ("float16", "float16"),
    ("bfloat16", "bfloat16"),
)
FORMATS = ("contiguous", "channels_last")  # channels_last becomes channels_last_3d for 5-D shapes
# split -> the ranks' batch sizes from one rank's image count n. "uneven" for a single image halves the other
# rank's spatial extent instead (see _case).
SPLITS = ("even", "uneven", "empty")
DEFAULT_SHAPE = "r50-layer1-64"
STEPS = ("train", "train", "eval")


def _format(fmt: str, ndim: int) -> str:
    if fmt == "channels_last" and ndim == 5:
        return "channels_last_3d"
    return fmt


def _case(shape: str, channels: int, spatial: tuple, n: int, dtype: str, pdtype: str, fmt: str, split: str,
          default: bool) -> Case:
    spatials = (spatial, spatial)
    if split == "even":
        batches = (n, n)
    elif split == "empty":
        batches = (n, 0)
    elif n > 1:
        batches = (n, n // 2 + 1)
    else:  # one image per rank: the second rank's is half as long along the first spatial dimension
        batches = (1, 1)
        spatials = (spatial, (spatial[0] // 2,) + tuple(spatial[1:]))
    fmt = _format(fmt, 2 + len(spatial))
    label = f"{split}-{'-'.join(map(str, batches))}"
    return Case(id=f"{FAMILY}/{shape}/{dtype}-{pdtype}/{fmt}/{label}/ws2", family=FAMILY, batch_sizes=batches,
                spatial=spatials, channels=channels, dtype=dtype, param_dtype=pdtype, memory_format=fmt,
                steps=STEPS, default=default)


# The default selection's rows of the default shape: (dtype pair, format, split). Four cases of about 3 million
# values per rank each: every split, both formats, float32, a float32 layer fed float16 and bfloat16, and a fully
# half model. A scale case costs seconds (inputs, oracle and judgement of 3 million values per rank on CPU), so
# the rest of the product is --exhaustive.
DEFAULT_ROWS = (
    (("float32", "float32"), "channels_last", "uneven"),
    (("float16", "float32"), "contiguous", "uneven"),
    (("bfloat16", "float32"), "channels_last", "empty"),
    (("float16", "float16"), "contiguous", "even"),
)


def cases() -> list[Case]:
    out = []
    for shape, channels, spatial, n in SHAPES:
        for dtype, pdtype in DTYPES:
            for fmt in FORMATS:
                for split in SPLITS:
                    default = shape == DEFAULT_SHAPE and ((dtype, pdtype), fmt, split) in DEFAULT_ROWS
                    out.append(_case(shape, channels, spatial, n, dtype, pdtype, fmt, split, default))
    return out
