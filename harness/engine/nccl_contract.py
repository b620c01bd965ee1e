"""``nccl-contract``: a process-group backend with NCCL's contract and gloo's transport, for CPU and CUDA tensors.

torch's SyncBatchNorm picks its all_gather by the process group's backend
name: ``gloo`` gathers into a list of tensors, every other backend (nccl and
the third-party ones) into one flat tensor. On a machine without GPUs only the
gloo branch can run, so the branch nearly every GPU user takes would go
untested; on a machine with one GPU, NCCL itself cannot put two ranks on it.
This backend is registered under another name, so torch takes that branch on
CPU and on a shared GPU (gloo carries CUDA tensors too), and it keeps the
promises NCCL makes to it:

- ``all_gather_into_tensor`` (``_allgather_base``, ``all_gather_single``):
  one flat output of ``world_size * input.numel()`` elements, whatever its
  shape (torch passes ``[1, world_size * n]``), dense, of the input's dtype;
  rank r's input lands in the r-th slice;
- every other collective (list all_gather, all_reduce, broadcast, barrier,
  reduce, gather, scatter, ...) as gloo does it, over the same processes.

Data moves through an inner gloo process group (its own prefix of the same
store) straight into the caller's tensors, so results are bitwise gloo's
(tests/engine/test_nccl_contract.py checks each collective SyncBN and DDP use).
Where NCCL's behaviour is undefined (operands that differ across ranks) this
backend fails as gloo does, with gloo's message; the harness's collective
fingerprint names the divergence first.

Protocol: call :func:`register` in a process before
``init_process_group(NAME, ...)``; it is idempotent. Subgroups
(``new_group``) get the same backend.
"""

from __future__ import annotations

import functools
import sys

NAME = "nccl-contract"

# Collectives handed to gloo as they are (same signature on both sides).
DELEGATED = ("allgather", "allgather_coalesced", "allreduce", "allreduce_coalesced", "broadcast", "barrier",
             "reduce", "gather", "scatter", "reduce_scatter", "alltoall", "alltoall_base", "send", "recv",
             "recv_anysource", "monitored_barrier")

_registered = False


def _delegate(name: str):
    def call(self, *args, **kwargs):
        return getattr(self.inner, name)(*args, **kwargs)

    call.__name__ = name
    call.__doc__ = f"gloo's {name}, on this group's processes."
    return call


def _flat_views(output, input, world_size: int) -> list:
    """The ``world_size`` slices of a flat all_gather output that NCCL fills, each shaped like ``input``."""
    if output.dtype != input.dtype:
        raise TypeError(f"{NAME}: all_gather into one tensor needs the output in the input's dtype, as NCCL does: "
                        f"output {output.dtype}, input {input.dtype}")
    if output.numel() != world_size * input.numel():
        raise ValueError(f"{NAME}: the output of all_gather into one tensor must hold world_size ({world_size}) "
                         f"times the input's {input.numel()} elements, as NCCL requires: it holds "
                         f"{output.numel()} (shape {list(output.shape)})")
    if not (output.is_contiguous() and input.is_contiguous()):
        raise ValueError(f"{NAME}: all_gather into one tensor needs dense (contiguous) tensors, as NCCL does")
    flat, n = output.view(-1), input.numel()
    return [flat[r * n:(r + 1) * n].view(input.shape) for r in range(world_size)]


@functools.lru_cache(maxsize=None)
def _group_class():
    import torch.distributed as dist

    class NcclContractGroup(dist.ProcessGroup):
        """A process group whose flat all_gather follows NCCL's contract; the rest is gloo's."""

        def __init__(self, store, rank: int, size: int, timeout):
            super().__init__(rank, size)
            self.inner = dist.ProcessGroupGloo(dist.PrefixStore(f"{NAME}/gloo", store), rank, size, timeout)

        def getBackendName(self) -> str:  # noqa: N802 - torch's name for it
            return NAME

        def _get_backend_name(self) -> str:
            return NAME

        @property
        def group_name(self) -> str:
            # torch names a group it creates itself (_set_group_name), but not one a backend's creator returns
            # whole, as this one is; it still records the name, which dynamo asks for when it traces a group.
            from torch.distributed.distributed_c10d import _world

            name = _world.pg_names.get(self)
            if name is None:
                raise RuntimeError(f"{NAME}: this process group has no name yet")
            return name

        def _allgather_base(self, output, input, opts=None):
            views = _flat_views(output, input, self.size())
            args = ([views], [input]) if opts is None else ([views], [input], opts)
            return self.inner.allgather(*args)

        def all_gather_single(self, output, input, opts=None):
            return self._allgather_base(output, input, opts)

        def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
            works = [self._allgather_base(o, i, opts) for o, i in zip(outputs, inputs)]
            for work in works[:-1]:
                work.wait()
            return works[-1]

    for name in DELEGATED:
        setattr(NcclContractGroup, name, _delegate(name))
    if "torch._dynamo" in sys.modules:
        _hide_from_dynamo(NcclContractGroup)
    return NcclContractGroup


# Methods of the group that dynamo must not trace (see hide_from_dynamo).
UNTRACED = (*DELEGATED, "_allgather_base", "all_gather_single", "allgather_into_tensor_coalesced")


def _hide_from_dynamo(cls) -> None:
    import torch._dynamo

    if getattr(cls, "_hidden_from_dynamo", False):
        return
    for name in UNTRACED:
        setattr(cls, name, torch._dynamo.disable(getattr(cls, name)))
    cls._hidden_from_dynamo = True


def hide_from_dynamo() -> None:
    """Keep the group's methods out of dynamo's tracing (idempotent; call before compiling).

    torch.compile sees a C++ process group as opaque and breaks the graph at its collectives; this one's
    methods are Python, which dynamo would trace into and reject. Kept out of tracing, they behave as
    NCCL's do under compile. Done here on demand, not when the group is made, because importing dynamo
    costs a rank more than a second that a case without compile or optimizers never needs.
    """
    if _registered:
        _hide_from_dynamo(_group_class())


def create(store, rank: int, size: int, timeout):
    """The creator torch calls for every group of this backend (the world and each ``new_group``)."""
    return _group_class()(store, rank, size, timeout)


def register() -> None:
    """Make ``NAME`` a backend ``init_process_group`` and ``new_group`` accept, for CPU and CUDA tensors."""
    global _registered
    if _registered:
        return
    import torch.distributed as dist

    try:
        dist.Backend.register_backend(NAME, create, devices=["cpu", "cuda"])
    except TypeError:  # torch < 2.0: no devices argument
        dist.Backend.register_backend(NAME, create)
    _registered = True
