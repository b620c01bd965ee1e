"""``list-contract``: a process-group backend whose all_gather takes only a list of tensors, as MPI's does.

Some process-group backends implement the list ``all_gather`` and not the
flat one (``all_gather_into_tensor``, ``_allgather_base``): torch's MPI group
(``RuntimeError: no support for _allgather_base in MPI process group``,
pytorch#85628) and third-party accelerators' groups. torch's SyncBatchNorm
chooses its all_gather by the group's backend name (the list for ``gloo``, the
flat one for every other name), so on such a backend it calls what the backend
lacks; the review of pytorch#104250, which made that choice, named MPI. This
backend is registered under its own name, so torch takes the flat branch on CPU
and meets the refusal an MPI-like backend gives:

- ``all_gather_into_tensor`` (``_allgather_base``, ``all_gather_single``,
  ``allgather_into_tensor_coalesced``) raises ``RuntimeError`` saying so;
- every other collective is gloo's over the same processes, as for
  :mod:`harness.engine.nccl_contract`, whose group this one derives from (the
  list all_gather, all_reduce, broadcast, barrier, ...; bitwise gloo's).

A SyncBN that gathers into a list works here as on gloo; DDP's own collectives
(broadcast, all_reduce, the parameter check's list all_gather) work too.

Protocol: call :func:`register_list_contract` in a process before
``init_process_group(LIST_NAME, ...)``; it is idempotent. Subgroups get the same
backend. The names here differ from nccl_contract's, since a standalone repro
file holds both modules' code in one namespace.
"""

from __future__ import annotations

import functools
import sys

from harness.engine import nccl_contract

LIST_NAME = "list-contract"
# What the group refuses: the flat all_gather under each of its names.
FLAT_GATHERS = ("_allgather_base", "all_gather_single", "allgather_into_tensor_coalesced")

_list_registered = False


def _refuse(name: str):
    def call(self, *args, **kwargs):
        raise RuntimeError(f"no support for _allgather_base in {LIST_NAME} process group ({name}: this backend "
                           "gathers into a list of tensors only, as MPI's does; pytorch#85628)")

    call.__name__ = name
    call.__doc__ = f"{name}: refused, as an MPI-like backend refuses the flat all_gather."
    return call


@functools.lru_cache(maxsize=None)
def _list_group_class():
    class ListContractGroup(nccl_contract._group_class()):
        """gloo's collectives over gloo's transport, but no flat all_gather: the list all_gather only."""

        def getBackendName(self) -> str:  # noqa: N802 - torch's name for it
            return LIST_NAME

        def _get_backend_name(self) -> str:
            return LIST_NAME

    for name in FLAT_GATHERS:
        setattr(ListContractGroup, name, _refuse(name))
    if "torch._dynamo" in sys.modules:
        _hide_list_group(ListContractGroup)
    return ListContractGroup


def _hide_list_group(cls) -> None:
    import torch._dynamo

    if cls.__dict__.get("_list_hidden", False):
        return
    for name in nccl_contract.UNTRACED:  # inherited ones too: a subclass's attribute hides the base's
        setattr(cls, name, torch._dynamo.disable(getattr(cls, name)))
    cls._list_hidden = True


def hide_list_group_from_dynamo() -> None:
    """Keep the group's Python methods out of dynamo's tracing, as :func:`nccl_contract.hide_from_dynamo` does
    for its own (idempotent; call before compiling)."""
    if _list_registered:
        _hide_list_group(_list_group_class())


def create_list_group(store, rank: int, size: int, timeout):
    """The creator torch calls for every group of this backend (the world and each ``new_group``)."""
    return _list_group_class()(store, rank, size, timeout)


def register_list_contract() -> None:
    """Make ``LIST_NAME`` a backend ``init_process_group`` and ``new_group`` accept, for CPU and CUDA tensors."""
    global _list_registered
    if _list_registered:
        return
    import torch.distributed as dist

    try:
        dist.Backend.register_backend(LIST_NAME, create_list_group, devices=["cpu", "cuda"])
    except TypeError:  # torch < 2.0: no devices argument
        dist.Backend.register_backend(LIST_NAME, create_list_group)
    _list_registered = True
