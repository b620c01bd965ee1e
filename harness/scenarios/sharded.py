"""FSDP2 as a training system of the model scenario: the network under ``fully_shard`` with mixed precision.

Model option ``fsdp2`` (``Case.options``; never with DDP): every normalization layer a unit of its own with
``MixedPrecisionPolicy()`` (no mixed precision: float32 parameters, the half activations passed in as they
come), then ``fully_shard(network, mp_policy=MixedPrecisionPolicy(param_dtype=<case.dtype>,
reduce_dtype=<case.param_dtype>))``: the rest computes in the case's dtype (bfloat16 or float16) with its
parameters all-gathered in it, while the sharded parameters, the optimizer and the gradients' reduce-scatter
stay in the parameter dtype (float32). That is the recipe given for BatchNorm under FSDP2 (torchtitan#674),
which FSDP1 applied by itself (pytorch#76642 for pytorch#75478); SyncBN then sees what AMP gives it: half
input, float32 parameters and statistics.

Not a case: the whole network as one unit. FSDP2 casts parameters, not buffers, so every normalization gets
half weights beside float32 running statistics, which ``nn.BatchNorm`` refuses in training and evaluation
("expected scalar type BFloat16 but found Float" on CPU, "Expected running_mean to have type BFloat16 but got
Float" on CUDA: torchtitan#674), so there is no expectation to judge by. torch's SyncBatchNorm trains there
(its CUDA kernels read the statistics in their own dtype) and refuses at evaluation, where it calls
``F.batch_norm``, as nn.BatchNorm does.

The gradients are averaged over the ranks as DDP's are (the oracle averages the shares), and judged, with
the parameters and the optimizer state, as full tensors (:func:`full_tensor`). FSDP2's own communication (its
parameter all-gathers and gradient reduce-scatters) goes through custom comms that run it unrecorded
(:meth:`harness.engine.rank.RankContext.unrecorded`): it is the training system's, as DDP's C++
communication is, not the implementation's, and an evaluation step must still issue no collective of the
implementation's. Most layers compute in the case's dtype, so results are judged as under autocast (that
dtype's rounding, normwise, :data:`harness.scenarios.uses.AUTOCAST_SLACK`).

Sharded training of SyncBN was reported broken under fairscale's and Lightning's sharded wrappers
(fairscale#489, Lightning#5210: "SyncBatchNorm is only supported within DistributedDataParallel");
torch's SyncBatchNorm has had no such check since 2.x, and this option runs it under torch's own FSDP.
"""

from __future__ import annotations

from typing import Optional

import torch

from harness.catalog.case import STEP_KINDS, Case
from harness.catalog.data import DTYPES

FSDP2_OPTIONS = ("fsdp2",)
FSDP2_COMPUTE = ("bfloat16", "float16")  # the compute dtypes a MixedPrecisionPolicy is given here


def fsdp2_of(case: Case) -> Optional[str]:
    """The case's FSDP2 option, or None."""
    found = [o for o in case.options if o in FSDP2_OPTIONS]
    return found[0] if found else None


def fsdp2_unsupported(case: Case) -> Optional[str]:
    """Why this build or the case's other choices cannot run its FSDP2 option (None: they can, or it has none)."""
    option = fsdp2_of(case)
    if option is None:
        return None
    if case.ddp:
        return "FSDP2 and DistributedDataParallel both wrap the network; a case takes one"
    if any(STEP_KINDS[k] == "eval" and k != "eval" for k in case.steps):
        return "FSDP2 all-gathers the parameters in every forward: no rank can evaluate while the others wait"
    if case.dtype not in FSDP2_COMPUTE or case.param_dtype != "float32":
        return (f"{option}: the case's dtype is the compute dtype (one of {', '.join(FSDP2_COMPUTE)}), its "
                f"parameter dtype float32, got {case.dtype}/{case.param_dtype}")
    try:
        from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard  # noqa: F401
    except ImportError:
        return f"torch {torch.__version__} has no torch.distributed.fsdp.fully_shard (FSDP2, torch >= 2.6)"
    if not hasattr(FSDPModule, "set_custom_all_gather"):
        return (f"torch {torch.__version__}'s FSDP2 takes no custom comms, which keep its own all-gathers apart "
                "from the implementation's collectives")
    return None


def _unrecorded_comms(ctx):
    """FSDP2's all-gather and reduce-scatter comms, issued unrecorded (``ctx.unrecorded()``)."""
    import torch.distributed as dist
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def gather(self, output_tensor, input_tensor, group, async_op=False):
        with ctx.unrecorded():  # torch's own functions are in place inside: look them up here
            flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            return flat(output_tensor, input_tensor, group=group, async_op=async_op)

    def scatter(self, output_tensor, input_tensor, group, op, async_op=False):
        with ctx.unrecorded():
            flat = getattr(dist, "reduce_scatter_single", None)
            if flat is not None:
                return flat(output=output_tensor, input=input_tensor, group=group, op=op, async_op=async_op)
            return dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group, async_op=async_op)

    gathers = type("UnrecordedAllGather", (AllGather,), {"allocate": allocate, "__call__": gather})
    scatters = type("UnrecordedReduceScatter", (ReduceScatter,), {"allocate": allocate, "__call__": scatter})
    return gathers(), scatters()


def shard_network(ctx, case: Case, net: torch.nn.Module, norms: list) -> torch.nn.Module:
    """``net`` (its parameters in the case's parameter dtype) sharded as the ``fsdp2`` option says; ``norms``: its
    normalization layers. Returns the sharded network (the same module, now an ``FSDPModule``)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    units = [fully_shard(norm, mp_policy=MixedPrecisionPolicy()) for norm in norms]
    policy = MixedPrecisionPolicy(param_dtype=DTYPES[case.dtype], reduce_dtype=DTYPES[case.param_dtype])
    units.append(fully_shard(net, mp_policy=policy))
    gather, scatter = _unrecorded_comms(ctx)
    for unit in units:
        unit.set_custom_all_gather(gather)
        unit.set_custom_reduce_scatter(scatter)
    return net


def full_tensor(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A sharded tensor (DTensor) as the whole tensor every rank holds; any other tensor as it is."""
    if t is None or not hasattr(t, "full_tensor"):
        return t
    return t.full_tensor()
