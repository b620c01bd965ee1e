"""What an implementation says to the other ranks: every collective it issues, recorded in order.

In a rank process, :func:`install_recorder` wraps torch.distributed's collective
functions (in ``torch.distributed`` and ``torch.distributed.distributed_c10d``,
where implementations and torch's own modules look them up at call time) so
that each call is written down, as a :class:`~harness.judge.call.Call`, before
it is issued; what leaves this module (:func:`recorded`, the sink) is its
stored form, plain data (:meth:`~harness.judge.call.Call.to_dict`):

    {"op": "all_gather", "group": [0, 1], "step": 0, "dtype": "float32", "shape": [9], "numel": 9}

The wrapper changes nothing else: same arguments, same result. A scenario
marks the step it is in (:func:`mark_step`); the calls of a task are
:func:`recorded` (from :func:`begin_task` on). With a ``sink`` file, each call
is also appended to it as one JSON line before it is issued (an unbuffered
write, so it survives the process dying inside the collective): the parent
reads a crashed or silent rank's calls there with :func:`read_sink`.

Inside :func:`forbid_collectives` (a step where no rank may talk to
another, such as evaluation on one rank while the others wait) a call raises
:class:`CollectiveForbidden` before anything is sent: the rank fails at once,
with a message naming the collective, instead of leaving its peers hanging.

C++-level communication (DDP's reducer and its buffer broadcasts) does not go
through these functions and is not recorded. Inside :func:`suspended` (the
compiled pass of a ``torch.compile`` case) torch's own functions are back in
place and nothing is recorded: dynamo must see the functions a user's program
has, since it puts those collectives in its graphs (it knows them by
identity, from when ``torch.distributed._functional_collectives`` was
imported: before the wrappers, which :func:`install_recorder` makes sure of).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from typing import Optional

from harness.judge.call import Call

# name -> (index of the tensor argument to describe, or None)
OPS = {
    "all_gather": 1, "all_gather_into_tensor": 1, "_all_gather_base": 1, "all_gather_single": 1, "all_reduce": 0,
    "reduce": 0,
    "broadcast": 0, "reduce_scatter": 0, "reduce_scatter_tensor": 1, "_reduce_scatter_base": 1, "all_to_all": 1,
    "all_to_all_single": 1, "gather": 0, "scatter": 0, "send": 0, "recv": 0, "barrier": None,
    "all_gather_object": None, "broadcast_object_list": None, "gather_object": None,
}
# keyword names of those tensor arguments, for calls that pass them by keyword
KEYWORDS = ("tensor", "input_tensor", "input", "tensor_list", "object_list")


class CollectiveForbidden(RuntimeError):
    """A collective was issued in a step where no rank may communicate."""


_calls: list[Call] = []
_step: Optional[int] = None
_forbidden: Optional[str] = None
_installed = False
_sink: Optional[int] = None  # file descriptor of the sink file
_sink_written = False  # whether the current task wrote to it
_wrappers: dict[str, tuple] = {}  # name -> (torch's function, its wrapper)


def install_recorder(sink: Optional[str] = None) -> None:
    """Wrap the collectives in this process (once); a no-op where torch.distributed is unavailable.

    ``sink``: a file that gets every call of the current task as a JSON line, written before the call is issued.
    """
    global _installed, _sink
    if sink is not None and _sink is None:
        _sink = os.open(sink, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    if _installed:
        return
    import torch.distributed as dist

    if not dist.is_available():
        return
    from torch.distributed import distributed_c10d as c10d

    try:  # dynamo's table of the collectives it traces, keyed by torch's functions: made before the wrappers
        import torch.distributed._functional_collectives  # noqa: F401
    except ImportError:  # torch < 2.1
        pass
    for name, arg in OPS.items():
        original = getattr(c10d, name, None) or getattr(dist, name, None)
        if original is None or getattr(original, "__syncbn_wrapped__", False):
            continue
        wrapped = _wrap(name, arg, original)
        _wrappers[name] = (original, wrapped)
        for module in (dist, c10d):
            if getattr(module, name, None) is original:
                setattr(module, name, wrapped)
    _installed = True


@contextlib.contextmanager
def suspended():
    """torch.distributed's own collective functions for the block: nothing is recorded or forbidden there."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    swapped = []
    for name, (original, wrapped) in _wrappers.items():
        for module in (dist, c10d):
            if getattr(module, name, None) is wrapped:
                setattr(module, name, original)
                swapped.append((module, name, wrapped))
    try:
        yield
    finally:
        for module, name, wrapped in swapped:
            setattr(module, name, wrapped)


def _wrap(name: str, arg: Optional[int], original):
    @functools.wraps(original)
    def call(*args, **kwargs):
        global _sink_written
        entry = describe_call(name, arg, args, kwargs)
        if _forbidden is not None:
            raise CollectiveForbidden(f"{name} issued during {_forbidden} ({entry.describe()} over ranks "
                                      f"{list(entry.group)}): no rank may talk to another there, so its peers "
                                      "would wait forever")
        _calls.append(entry)
        if _sink is not None:
            os.write(_sink, (json.dumps(entry.to_dict()) + "\n").encode())
            _sink_written = True
        return original(*args, **kwargs)

    call.__syncbn_wrapped__ = True
    return call


def describe_call(name: str, arg: Optional[int], args: tuple, kwargs: dict) -> Call:
    """One call: op, group ranks, dtype, shape and element count of its tensor, step."""
    import torch

    group = tuple(_group_ranks(kwargs.get("group", _positional_group(name, args))))
    t = None
    if arg is not None:
        t = args[arg] if len(args) > arg else next((kwargs[k] for k in KEYWORDS if k in kwargs), None)
    if isinstance(t, (list, tuple)) and t and isinstance(t[0], torch.Tensor):
        t = t[0]
    if isinstance(t, torch.Tensor):
        return Call(name, group, str(t.dtype).replace("torch.", ""), tuple(t.shape), t.numel(), _step)
    return Call(name, group, step=_step)


def _positional_group(name: str, args: tuple):
    # group is the third positional argument of all_gather/all_reduce/broadcast-style calls
    positions = {"all_reduce": 2, "broadcast": 2, "all_gather": 2, "all_gather_into_tensor": 2,
                 "all_gather_single": 2, "_all_gather_base": 2, "reduce": 3}
    i = positions.get(name)
    return args[i] if i is not None and len(args) > i else None


def _group_ranks(group) -> list[int]:
    import torch.distributed as dist

    try:
        if group is None or group is dist.group.WORLD:
            return list(range(dist.get_world_size()))
        return sorted(dist.get_process_group_ranks(group))
    except Exception:  # noqa: BLE001 - an unknown group is recorded as such, never a reason to fail the call
        return []


def begin_task() -> None:
    """Forget earlier calls (and empty the sink): a new task starts."""
    global _step, _forbidden, _sink_written
    _calls.clear()
    if _sink is not None and _sink_written:  # a task without collectives leaves the file empty: no system call
        os.ftruncate(_sink, 0)
        _sink_written = False
    _step, _forbidden = None, None


def mark_step(index: Optional[int]) -> None:
    """The calls from now on belong to step ``index`` of the case."""
    global _step
    _step = index


def recorded() -> list[dict]:
    """The calls recorded since :func:`begin_task`, in order, in their stored form."""
    return [c.to_dict() for c in _calls]


def read_sink(path) -> Optional[list[dict]]:
    """The calls a rank wrote to its sink file during its current task (None if there is no such file).

    A line cut short (the process died while writing it) is left out.
    """
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


@contextlib.contextmanager
def forbid_collectives(why: str):
    """Any collective inside the block raises :class:`CollectiveForbidden` (``why`` names the step)."""
    global _forbidden
    previous, _forbidden = _forbidden, why
    try:
        yield
    finally:
        _forbidden = previous

