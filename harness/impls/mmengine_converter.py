"""mmengine's converter (``--impl mmengine``, opt-in): ``mmengine.model.convert_sync_batchnorm`` to torch's layer.

Design: ``convert_sync_batchnorm(module, implementation="torch")`` replaces
every ``_BatchNorm`` with ``torch.nn.SyncBatchNorm``, sharing the parameters
and buffers; the layers it makes are torch's, run exactly as the ``torch``
adapter runs them (natively on CUDA, cpu-emulation on CPU: this class is the
``torch`` adapter with another converter). So only the cases that convert a
model (the ``conversion`` family, checkpoint round trips included, and the
layer cases that take their layer from a converted model, ``convert-nested``)
say something the ``torch`` records do not; every other case is
``unsupported``.

The converter takes no process group (its second argument is
``implementation``, "torch" or "mmcv"), so every converted layer synchronizes
over the whole world: cases that need a subgroup (``groups``, or a checkpoint
resumed on fewer ranks than it was taken on, ``resume-*``) are
``unsupported`` with that reason. ``revert_sync_batchnorm`` (SyncBatchNorm
back to a plain ``_BatchNormXd``) is this adapter's revert: the ``revert``
scenario's cases (``conversion/revert/*``) run it after a training step.
"""

from __future__ import annotations

from harness.impls.base import Capabilities
from harness.impls.torch_layer import TorchLayerAdapter


class MmengineImpl(TorchLayerAdapter):
    """``torch.nn.SyncBatchNorm`` layers made by ``mmengine.model.convert_sync_batchnorm``."""

    name = "mmengine"
    package = "mmengine"
    probe = ("mmengine.model", "convert_sync_batchnorm")
    install_hint = "pip install mmengine"
    takes_process_group = False

    capabilities = Capabilities(convert=True, revert=True)

    def library_converter(self):
        from mmengine.model import convert_sync_batchnorm

        return lambda model: convert_sync_batchnorm(model, implementation="torch")

    def library_revert(self):
        from mmengine.model import revert_sync_batchnorm

        return revert_sync_batchnorm
