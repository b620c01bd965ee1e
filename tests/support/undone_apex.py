"""apex's Python ``SyncBatchNorm`` and ``convert_syncbn_model`` with one upstream fix undone, as harness plugins.

Each is ``apex.parallel``'s installed fallback class (the last commit with ``apex.parallel``, e13873de) with one
method, or the converter, recompiled from the installed source with the lines as they were before the fix
(:mod:`source_edits`):

- :class:`ReturnUndone`: apex#384 undone (2019-07): the training forward computed its output and returned None.
- :class:`ChannelLastUndone`: apex#167 undone (2019-01): the fallback's constructor took no ``channel_last``,
  which ``convert_syncbn_model`` passes (apex#166): every conversion raised.
- :class:`NestedGroupUndone`: apex#94 undone (2018-12): the converter's recursion passed neither the process
  group nor ``channel_last`` to nested layers, which synchronized over the whole world.
- :class:`CountUndone`: apex#380 undone (2019-09): the converter did not copy ``num_batches_tracked``.
- :class:`GroupPerForwardUndone`: apex#105 undone (2019-01): without a process group, every training forward made
  a new one (``new_group()``), which made NCCL training stall.
- :class:`InstanceNormUndone`: apex#438 undone (2019-08): the converter turned InstanceNorm layers into SyncBatchNorm
  (apex#437). The defect needed a torch whose ``_InstanceNorm`` was a ``_BatchNorm`` (before torch 1.4), so the
  undo drops the fix's InstanceNorm check and matches every ``_NormBase``, which is what ``_BatchNorm`` matched then.
- :class:`Control`: the same plugin without edits.

On a CPU-only torch build the fallback's NVTX marks are made no-ops, as the apex adapter does. Run with apex on
``PYTHONPATH``: ``PYTHONPATH=tests/support:APEX python -m harness run --impl undone_apex:ReturnUndone --case ...``.
"""

from __future__ import annotations

import apex.parallel
from apex.parallel import sync_batchnorm
from source_edits import edited_function, edited_method

from harness.impls.apex import _nvtx_noop, nvtx_usable

if not nvtx_usable():  # the rank processes import this module before they build a layer
    _nvtx_noop()

Fallback = sync_batchnorm.SyncBatchNorm
convert_syncbn_model = apex.parallel.convert_syncbn_model

# Method sources are dedented: a method's body is indented by four spaces, a module function's too.
RETURN = [["    return out.to(cast)\n", "    out = out.to(cast)\n"]]
CHANNEL_LAST = [["process_group=None, channel_last=False):", "process_group=None):"],
                ["    if channel_last == True:\n", "    if False:\n"]]
_ALIGN = " " * 50  # the converter's continuation lines are aligned under its recursive call's first argument
NESTED = [[f"convert_syncbn_model(child,\n{_ALIGN}process_group=process_group,\n{_ALIGN}channel_last=channel_last)",
           "convert_syncbn_model(child)"]]
COUNT = [["        mod.num_batches_tracked = module.num_batches_tracked\n", ""]]
INSTANCE_NORM = [["    if isinstance(module, torch.nn.modules.instancenorm._InstanceNorm):\n"
                  "        return module\n", ""],
                 ["isinstance(module, torch.nn.modules.batchnorm._BatchNorm)",
                  "isinstance(module, torch.nn.modules.batchnorm._NormBase)"]]
GROUP_PER_FORWARD = [["        process_group = torch.distributed.group.WORLD\n",
                      "        process_group = torch.distributed.new_group()\n"]]


class Control(Fallback):
    """apex's fallback SyncBatchNorm and ``convert_syncbn_model``, as installed."""

    name = "apex fallback (as installed)"
    converter_edits = ()  # what a subclass writes over apex's converter

    @classmethod
    def convert_sync_batchnorm(cls, module, process_group=None):
        """apex's converter (recompiled with ``converter_edits``), building this class's layers."""
        convert = edited_function(convert_syncbn_model, cls.converter_edits, SyncBatchNorm=cls)
        return convert(module, process_group=process_group)


class ReturnUndone(Control):
    """apex#384 undone: the training forward returns None."""

    name = "apex fallback, apex#384 undone"
    forward = edited_method(Fallback, "forward", RETURN)


class ChannelLastUndone(Control):
    """apex#167 undone: the constructor refuses ``channel_last``, which the converter passes."""

    name = "apex fallback, apex#167 undone"
    __init__ = edited_method(Fallback, "__init__", CHANNEL_LAST)


class NestedGroupUndone(Control):
    """apex#94 undone: nested layers are converted without the process group."""

    name = "apex fallback, apex#94 undone"
    converter_edits = NESTED


class CountUndone(Control):
    """apex#380 undone: ``num_batches_tracked`` is not copied by the converter."""

    name = "apex fallback, apex#380 undone"
    converter_edits = COUNT


class GroupPerForwardUndone(Control):
    """apex#105 undone: a training forward without a process group makes a new one."""

    name = "apex fallback, apex#105 undone"
    forward = edited_method(Fallback, "forward", GROUP_PER_FORWARD)


class InstanceNormUndone(Control):
    """apex#438 undone, on the class hierarchy of its day: the converter turns InstanceNorm into SyncBatchNorm."""

    name = "apex fallback, apex#438 undone"
    converter_edits = INSTANCE_NORM
