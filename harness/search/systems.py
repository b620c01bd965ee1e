"""The training systems ``search`` draws beside layer cases: networks, DDP, conversion, compile and training uses.

A *system* names what a drawn case exercises (``--system`` on ``search``):

- ``model``: a small network (:mod:`harness.scenarios.networks`) trained
  without DDP, with evaluation steps, validation on a subset of ranks among
  them;
- ``ddp``: the network under DistributedDataParallel with a drawn subset of
  its options, SGD or Adam, ``no_sync`` accumulation;
- ``compile``: the network (with or without DDP) under ``torch.compile``
  (``eager`` or ``aot_eager``; inductor's compiles cost too much per case);
- ``conversion``: a user's model converted by the implementation
  (:mod:`harness.scenarios.user_models`; the converter traps ``bn-act`` and
  ``lazy`` are the catalog's);
- ``validation``, ``activation-checkpoint``, ``double-backward``,
  ``autocast``, ``script``, ``join``, ``autocast-grad-scaler``: the training
  uses (:mod:`harness.scenarios.uses`), each with or without DDP (``join``
  and ``autocast-grad-scaler``, which steps an optimizer: always);
- ``fsdp2``: the network sharded by FSDP2 with mixed precision (the ``fsdp2``
  model option, :mod:`harness.scenarios.sharded`): bfloat16 or float16
  compute over float32 parameters, SGD, every rank in every step.

Every network case also draws the model options (``Case.options``): BN affine
parameters frozen while the statistics train, and data that does not require
grad as the network's input; and the momentum (0.1 or None).

Order matters for shrinking, as in :mod:`harness.search.space`: every choice
lists its plainest value first (no DDP, no option, the smallest network,
float32, momentum 0.1), the steps and per-rank batches are lists hypothesis
shortens, so a shrunk case has the fewest steps, ranks and options that
still fail the same way. IDs::

    search/system/<system>/<network>/<dtype>/<split>/<options>/<steps>/ws<n>-<digest>

where ``<options>`` joins the DDP flags, model options, momentum and compile
backend with ``+`` (``plain`` when there are none), so the known-issues
file's patterns can name them.
"""

from __future__ import annotations

from typing import Optional

from harness.catalog.case import CHECKPOINT_USES, CONVERSION_MODELS, USES, Case
from harness.search.space import FAMILY, digest, split_label

# The systems of the training uses (the catalog's names): every checkpointing use is one system, drawn
# non-reentrant first (the plainer, for shrinking); every other use is a system of its own name.
USE_OF = {"activation-checkpoint": tuple(sorted(CHECKPOINT_USES, key=lambda u: u.endswith("-reentrant"))),
          **{u: (u,) for u in USES if u not in CHECKPOINT_USES}}
SYSTEMS = ("model", "ddp", "compile", "conversion", "validation") + tuple(USE_OF) + ("fsdp2",)
# The uses that need DDP: join's, and a loss scaler's (it steps an optimizer, which needs averaged gradients).
DDP_USES = ("join", "autocast-grad-scaler")
# What --system all draws: every system but join, whose expected failure is a 15 s hang.
DEFAULT_SYSTEMS = tuple(s for s in SYSTEMS if s != "join")
# Smallest first. Not bn-chain: its first layers' exact affine gradients vanish (the next normalization removes
# their shift and scale), so a rank holding the whole batch has a share of 0 whose rounding no relative budget
# covers; the catalog runs it where every rank holds part of the batch.
NETWORKS = ("bn-first", "cnn", "resblock")
DDP_FLAGS = ("broadcast_buffers=False", "static_graph", "find_unused_parameters", "gradient_as_bucket_view",
             "bucket_cap_mb=0.0001", "no_sync=2")
OPTIONS = ("frozen-norm", "data-input")
STEPS = ("train", "eval", "eval-rank0", "eval-subset")
CONVERTED = tuple(m for m in CONVERSION_MODELS if m not in ("bn-act", "lazy"))


def strategy(systems: tuple = DEFAULT_SYSTEMS, world_sizes: tuple = (2, 3)):
    """The hypothesis strategy of training-system cases of ``systems`` (see the module docstring)."""
    from hypothesis import assume
    from hypothesis import strategies as st

    @st.composite
    def cases(draw) -> Case:
        # The same draws in the same order whatever the system, each system reading what it needs: shrinking
        # the system toward the plainest one (model) keeps every other choice, so a failure that does not need
        # DDP, a use or an option loses them.
        system = draw(st.sampled_from(tuple(s for s in SYSTEMS if s in systems)))
        # Conversion: every rank holds part of the batch (its user models chain normalizations, whose vanishing
        # gradients a rank holding everything would carry whole: see NETWORKS).
        low = 1 if system == "conversion" else 0
        sizes = tuple(draw(st.lists(st.integers(low, 5), min_size=min(world_sizes), max_size=max(world_sizes))))
        # Two samples at least: with one, a normalization followed by global pooling outputs its bias whatever
        # came before, every upstream gradient is exactly 0, and no relative budget covers its rounding.
        assume(sum(sizes) >= 2 and len(sizes) in world_sizes)
        ws = len(sizes)
        network = draw(st.sampled_from(NETWORKS))
        steps = tuple(draw(st.lists(st.sampled_from(STEPS), min_size=1, max_size=4)))
        ddp_wanted = draw(st.booleans())
        flags = tuple(f for f in DDP_FLAGS if draw(st.booleans()))
        optimizer = draw(st.sampled_from(("sgd", "adam")))
        options = tuple(o for o in OPTIONS if draw(st.booleans()))
        momentum = draw(st.sampled_from((0.1, None)))
        dtype = draw(st.sampled_from(("float32", "float64")))
        variant = draw(st.integers(0, 3))
        backend = draw(st.sampled_from(("eager", "aot_eager")))
        converted = draw(st.sampled_from(CONVERTED))
        seed = draw(st.integers(0, 2**31 - 1))
        if system == "conversion":
            kinds = tuple(k for k in steps if k in ("train", "eval")) or ("train",)
            assume(converted != "no-running-stats" or "eval" not in kinds)  # its eval normalizes each rank alone
            return make_case(system, batch_sizes=sizes, spatial=((3, 2),) * ws, channels=6, dtype=dtype,
                             param_dtype=dtype, steps=kinds, scenario="conversion", model=converted, seed=seed)
        use = USE_OF[system][variant % len(USE_OF[system])] if system in USE_OF else None
        ddp_on = system == "ddp" or use in DDP_USES or (system not in ("model", "fsdp2") and ddp_wanted)
        flags = ("ddp",) + flags if ddp_on else ()
        if system == "compile":  # dynamo's DDP optimizer asserts its first bucket is the smallest
            flags = tuple(f for f in flags if f != "bucket_cap_mb=0.0001")
        if use == "double-backward" or network != "bn-first":
            # A penalty needs the input's gradient; elsewhere a conv comes first, whose weight makes every
            # normalization's input require grad anyway.
            options = tuple(o for o in options if o != "data-input")
        if use in ("autocast", "autocast-grad-scaler"):
            dtype = "float32"
        if system == "fsdp2":  # half compute over float32 parameters; SGD (Adam amplifies half rounding: cases/fsdp.py)
            dtype, optimizer = {"float32": "bfloat16", "float64": "float16"}[dtype], "sgd"
            options += ("fsdp2",)
            steps = tuple(k for k in steps if k in ("train", "eval")) or ("train",)
        if system == "validation":
            assume(any(k in ("eval-rank0", "eval-subset") for k in steps))
        if use == "join":  # rank r has len - r batches, every rank at least one
            steps = ("train",) * (len(steps) + ws)
        # A loss scaler's loss: a mean over 1024 outputs (its gradient 2**-10 * (1 + N(0, 1))), as the catalog's
        # (cases/autocast.py); plain normals, scaled by 2**16, overflow half for every layer.
        loss = {"grad_mean": 1.0, "grad_scale": 2.0**-10} if use == "autocast-grad-scaler" else {}
        return make_case(system, batch_sizes=sizes, spatial=((4, 4),) * ws, channels=3, dtype=dtype,
                         param_dtype="float32" if system == "fsdp2" else dtype, steps=steps, scenario="model",
                         model=network, optimizer=optimizer if ddp_on or system == "fsdp2" else None, ddp=flags,
                         use=use, options=options,
                         momentum=momentum, compile=(backend,) if system == "compile" else (),
                         time_limit=15.0 if use == "join" else None, seed=seed, **loss)

    return cases()


def make_case(system: str, **fields) -> Case:
    """A training-system search case with its ID (see the module docstring)."""
    from dataclasses import replace

    probe = Case(id=f"{FAMILY}/-", family=FAMILY, default=False, **fields)
    tags = [t.replace("=", "-").replace("_", "-") for t in probe.ddp] + list(probe.options)
    if probe.momentum is None:
        tags.append("momentum-none")
    if probe.optimizer:
        tags.append(probe.optimizer)
    tags += [f"compile-{b}" for b in probe.compile]
    if probe.use in CHECKPOINT_USES:
        tags.append(probe.use)
    cid = (f"{FAMILY}/system/{system}/{probe.model}/{probe.dtype}/{split_label(probe.batch_sizes)}/"
           f"{'+'.join(tags) or 'plain'}/{'-'.join(probe.steps)}/ws{probe.world_size}-{digest(probe)}")
    return replace(probe, id=cid)


def system_of(case: Case) -> Optional[str]:
    """The system a search case exercises (from its ID), None for a layer case."""
    parts = case.id.split("/")
    return parts[2] if len(parts) > 2 and parts[1] == "system" else None
