"""The case space that ``search`` explores: a hypothesis strategy of layer cases.

Every parameter the layer families of the catalog vary is drawn here, with
their combinations free: world size 2-4, per-rank batch sizes (empty ranks
included) and per-rank spatial sizes, subgroups, 2-D to 5-D input, widths up
to 2048, every dtype pair the catalog uses, both memory formats and a
gradient in the other, affine and running statistics on or off, momentum
(None included) and eps, step sequences (train, eval, a training forward
under no_grad, evaluation on rank 0 alone, two forwards and one backward)
with batch sizes that change between steps, inputs with large offsets, tiny
spreads and constant channels, permuted or sliced views, torch's non-gloo
code path on CPU, and sizes up to the per-rank counts networks train at
(:data:`LARGE_COUNT` values per channel).

Order matters for shrinking: hypothesis shrinks a ``sampled_from`` towards
its first element and integers towards their lower bound, so every choice
lists its plainest value first (two ranks, float32, contiguous, dense,
momentum 0.1, affine, running statistics, normal inputs, no subgroups) and a
shrunk case is the smallest and plainest one that still fails.

A drawn case's tensors are made from standard normals drawn in float32
(``normals``), five times faster on CPU than the catalog's float64 ones: a
large case's draws were a third of its time. Each rank's samples come from a
generator of its own (``draws="per-rank"``), so a rank makes only its own part
and the oracle's group-wide sums cross between the ranks
(:mod:`harness.engine.exchange`) instead of every rank making every rank's.

A drawn case is plain :class:`~harness.catalog.case.Case` data with an ID
that says what matters for selection and for the known-issues file's
patterns, then a digest of the parameters::

    search/<dtype>-<param dtype>/<memory format>/<split>/<shape>/<traits>/<steps>/ws<n>-<digest>

where ``<split>`` is ``even-4-4``, ``uneven-3-5`` or ``empty-0-5`` (the
first step's batch sizes), ``<shape>`` the channels and rank 0's spatial
size (``c64x56x56``) and ``<traits>`` the non-default settings joined by
``+`` (``plain`` when there are none), e.g. ``momentum-none+groups-01-23``.
"""

from __future__ import annotations

import json
import math
import zlib
from typing import Optional

from harness.catalog.case import Case

FAMILY = "search"

DTYPE_PAIRS = (
    ("float32", "float32"),
    ("float16", "float32"),
    ("bfloat16", "float32"),
    ("float16", "float16"),
    ("bfloat16", "bfloat16"),
    ("float64", "float64"),
    ("float32", "float64"),
)
STEP_CHOICES = ("train", "eval", "nograd", "eval-rank0", "fwd")
MOMENTA = (0.1, None, 0.5, 0.01)
EPSILONS = (1e-5, 1e-3, 0.1)
# (name, input_mean, input_scale): normal inputs first, then the numerics family's hostile ones.
INPUTS = (("normal", 0.0, 1.0), ("offset-1e3", 1000.0, 1.0), ("offset-1e4", 1e4, 0.5), ("spread-3e-3", 0.0, 3e-3),
          ("spread-1e-4", 0.0, 1e-4))
PARTITIONS = {
    2: (((0,), (1,)),),
    3: (((0,), (1, 2)), ((0, 1), (2,))),
    4: (((0, 1), (2, 3)), ((0, 2), (1, 3)), ((0,), (1, 2, 3))),
}
SMALL_DIM = 6  # spatial extent per dimension of a small case
LARGE_COUNT = 600_000  # most values per channel on one rank (ResNet-50's stem at 32 images: 401,408)
MAX_ELEMENTS = 1 << 22  # most elements of one rank's input: bounds a generated case's memory and time
WIDTHS = (67, 130, 256, 1024, 2048)
LARGE_DIM = 65_536  # the long spatial dimension of a large case
LARGE_BATCH = 200_000
LARGE_ONE_IN = 8  # the batch of a large 2-D case (no spatial dimensions)


WORLD_SIZES = (2, 3, 4)


def strategy(backends: tuple = (None, "nccl-contract"), world_sizes: tuple = WORLD_SIZES, allow_large: bool = True):
    """The hypothesis strategy of search cases (``backends``: the case backends allowed here; ``world_sizes``:
    the world sizes drawn, a subset of :data:`WORLD_SIZES`; ``allow_large``: draw large cases too)."""
    from hypothesis import assume
    from hypothesis import strategies as st

    @st.composite
    def cases(draw) -> Case:
        ws = draw(st.sampled_from(tuple(sorted(world_sizes))))
        ndim = draw(st.sampled_from((4, 2, 3, 5)))
        channels = draw(st.one_of(st.integers(1, 8), st.sampled_from(WIDTHS)))
        dtype, pdtype = draw(st.sampled_from(DTYPE_PAIRS))
        cl = {4: "channels_last", 5: "channels_last_3d"}.get(ndim)
        fmt = draw(st.sampled_from(("contiguous", cl))) if cl else "contiguous"
        grad_fmt = draw(st.sampled_from((None, "contiguous" if fmt != "contiguous" else cl))) if cl else None
        # One case in LARGE_ONE_IN is large: they cost seconds, small ones a tenth of a second.
        large = allow_large and draw(st.integers(0, LARGE_ONE_IN - 1)) == LARGE_ONE_IN - 1
        n_sp = ndim - 2
        per_rank_spatial = draw(st.booleans()) if n_sp else False

        def spatial_shape():
            # A large case is long along its first spatial dimension (up to LARGE_DIM), small elsewhere.
            return tuple(draw(st.integers(1, LARGE_DIM if large and i == 0 else SMALL_DIM)) for i in range(n_sp))

        first = spatial_shape()
        spatial = tuple(spatial_shape() if per_rank_spatial and r else first for r in range(ws))
        max_batch = 8 if not large else (LARGE_BATCH if n_sp == 0 else 2)
        sizes = tuple(draw(st.integers(0, max_batch)) for _ in range(ws))
        steps = _steps(draw(st.lists(st.sampled_from(STEP_CHOICES), min_size=1, max_size=5)))
        change = draw(st.sampled_from(("none", "last-smaller", "each-step")))
        step_sizes: Optional[tuple] = None
        if change == "last-smaller" and len(steps) > 1:
            step_sizes = (sizes,) * (len(steps) - 1) + (tuple((b + 1) // 2 for b in sizes),)
        elif change == "each-step" and len(steps) > 1:
            step_sizes = (sizes,) + tuple(tuple(draw(st.integers(0, max_batch)) for _ in range(ws))
                                          for _ in steps[1:])
        groups = draw(st.sampled_from((None,) + PARTITIONS[ws]))
        affine = draw(st.sampled_from((True, False)))
        stats = draw(st.sampled_from((True, False)))
        momentum = draw(st.sampled_from(MOMENTA))
        eps = draw(st.sampled_from(EPSILONS))
        inputs = draw(st.sampled_from(INPUTS))
        constant = tuple(sorted(set(draw(st.lists(st.integers(0, channels - 1), max_size=2)))))
        layout = draw(st.sampled_from(("dense", "permuted", "sliced")))
        backend = draw(st.sampled_from(backends))
        seed = draw(st.integers(0, 2**31 - 1))

        counts = [[b * math.prod(sp) for b, sp in zip(step_sizes[s] if step_sizes else sizes, spatial)]
                  for s in range(len(steps))]
        assume(max(b * math.prod(sp) for b, sp in zip(_max_sizes(sizes, step_sizes), spatial)) * channels
               <= MAX_ELEMENTS)
        assume(max(math.prod(sp) for sp in spatial) * max(max(sizes), 1) <= LARGE_COUNT)
        assume(valid_counts(steps, counts, groups or (tuple(range(ws)),), stats))
        return make_case(
            batch_sizes=sizes, spatial=spatial, channels=channels, dtype=dtype, param_dtype=pdtype,
            memory_format=fmt, grad_memory_format=grad_fmt, affine=affine, track_running_stats=stats,
            momentum=momentum, eps=eps, steps=steps, groups=groups, input_mean=inputs[1], input_scale=inputs[2],
            constant_channels=constant, step_batch_sizes=step_sizes, input_layout=layout, backend=backend,
            seed=seed)

    return cases()


def _steps(drawn: list[str]) -> tuple[str, ...]:
    """A drawn step list made valid: a ``fwd`` is always followed by the ``train`` step of its backward."""
    out: list[str] = []
    for s in drawn:
        out += ["fwd", "train"] if s == "fwd" else [s]
    return tuple(out)


def _max_sizes(sizes: tuple, step_sizes: Optional[tuple]) -> tuple:
    if not step_sizes:
        return sizes
    return tuple(max(s[r] for s in step_sizes) for r in range(len(sizes)))


def valid_counts(steps, counts, groups, track_running_stats: bool) -> bool:
    """Whether every step is well defined: batch statistics of more than one value per channel.

    Training normalizes over each group's values together (torch and every SyncBN refuse one value: its
    variance is undefined); evaluation without running statistics normalizes each rank alone.
    """
    from harness.catalog.case import STEP_KINDS

    for kind, row in zip(steps, counts):
        if STEP_KINDS[kind] == "train":
            if any(sum(row[r] for r in g) < 2 for g in groups):
                return False
        elif not track_running_stats and any(c == 1 for c in row):
            return False
    return True


def split_label(sizes: tuple[int, ...]) -> str:
    """``even-4-4``, ``uneven-3-5`` or ``empty-0-5`` for the ranks' batch sizes."""
    kind = "empty" if 0 in sizes else ("even" if len(set(sizes)) == 1 else "uneven")
    return f"{kind}-{'-'.join(map(str, sizes))}"


def traits(case_fields: dict) -> list[str]:
    """The case's non-default settings, as the ID names them."""
    f = case_fields
    out = []
    if f["momentum"] is None:
        out.append("momentum-none")
    elif f["momentum"] != 0.1:
        out.append(f"momentum-{f['momentum']:g}")
    if not f["affine"]:
        out.append("no-affine")
    if not f["track_running_stats"]:
        out.append("no-running-stats")
    if f["eps"] != 1e-5:
        out.append(f"eps-{f['eps']:g}")
    if f["groups"]:
        out.append("groups-" + "-".join("".join(map(str, g)) for g in f["groups"]))
    name = next((n for n, m, s in INPUTS if (m, s) == (f["input_mean"], f["input_scale"])), None)
    if name and name != "normal":
        out.append(name)
    if f["constant_channels"]:
        out.append("constant-" + "-".join(map(str, f["constant_channels"])))
    if len(set(map(tuple, f["spatial"]))) > 1:
        out.append("spatial-per-rank")
    if f["step_batch_sizes"]:
        out.append("sizes-change")
    if f["grad_memory_format"] and f["grad_memory_format"] != f["memory_format"]:
        out.append(f"grad-{f['grad_memory_format']}")
    if f["input_layout"] != "dense":
        out.append(f["input_layout"])
    if f["backend"]:
        out.append(f["backend"])
    return out


def make_case(**fields) -> Case:
    """A search case with its ID (see the module docstring; the digest is :func:`digest`): seed 0, normals
    drawn in float32 and each rank's drawn by a generator of its own unless given."""
    from dataclasses import replace

    fields.setdefault("seed", 0)
    fields.setdefault("normals", "float32")
    fields.setdefault("draws", "per-rank")
    probe = Case(id=f"{FAMILY}/-", family=FAMILY, default=False, **fields)
    f = probe.to_dict()
    tags = traits(f)
    shape = "x".join(map(str, (f"c{probe.channels}", *probe.spatial[0])))
    cid = (f"{FAMILY}/{probe.dtype}-{probe.param_dtype}/{probe.memory_format}/{split_label(probe.batch_sizes)}/"
           f"{shape}/{'+'.join(tags) or 'plain'}/{'-'.join(probe.steps)}/ws{probe.world_size}-{digest(probe)}")
    return replace(probe, id=cid)


def parameters(case: Case) -> dict:
    """``case``'s fields but its name, family, selection and note: what :func:`make_case` takes."""
    return {k: v for k, v in case.to_dict().items() if k not in ("id", "family", "default", "note")}


def digest(case: Case) -> str:
    """Eight hex digits over ``case``'s :func:`parameters`."""
    body = json.dumps(parameters(case), sort_keys=True)
    return f"{zlib.crc32(body.encode()) & 0xFFFFFFFF:08x}"


def without_rank(case: Case, rank: int) -> Optional[Case]:
    """``case`` with rank ``rank`` removed (its batch, spatial size and per-step sizes; groups renumbered; the
    other ranks' data as it was), or None when that leaves fewer than two ranks or a step that is not well
    defined."""
    if case.world_size <= 2:
        return None
    keep = [r for r in range(case.world_size) if r != rank]
    renumber = {r: i for i, r in enumerate(keep)}
    groups = None
    if case.groups:
        groups = tuple(tuple(renumber[r] for r in g if r != rank) for g in case.groups)
        groups = tuple(g for g in groups if g)
        if len(groups) == 1:
            groups = None
    step_sizes = tuple(tuple(row[r] for r in keep) for row in case.step_batch_sizes) if case.step_batch_sizes \
        else None
    fields = parameters(case)
    fields.update(batch_sizes=tuple(case.batch_sizes[r] for r in keep), spatial=tuple(case.spatial[r] for r in keep),
                  step_batch_sizes=step_sizes, groups=groups)
    if case.draws == "per-rank":  # the other ranks keep their generators, and so their data
        seeds = case.seeds_of_ranks()
        fields["rank_seeds"] = tuple(seeds[r] for r in keep)
    for key in ("steps", "constant_channels", "ddp", "compile", "options"):
        fields[key] = tuple(fields[key])
    counts = [[b * math.prod(sp) for b, sp in zip(step_sizes[s] if step_sizes else fields["batch_sizes"],
                                                   fields["spatial"])] for s in range(len(case.steps))]
    if not valid_counts(case.steps, counts, groups or (tuple(range(len(keep))),), case.track_running_stats):
        return None
    return make_case(**fields)


def size_of(case: Case) -> dict:
    """What shrinking makes small, for reports: ranks, steps, channels, the largest per-rank count per channel."""
    counts = [b * math.prod(sp) for s in range(len(case.steps)) for b, sp in zip(case.sizes_at(s), case.spatial)]
    return {"world_size": case.world_size, "steps": len(case.steps), "channels": case.channels,
            "ndim": case.ndim, "max_count_per_rank": max(counts) if counts else 0,
            "elements_per_rank": max(counts) * case.channels if counts else 0}
