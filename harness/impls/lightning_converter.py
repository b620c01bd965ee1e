"""Lightning's converter (``--impl lightning``, opt-in): ``TorchSyncBatchNorm().apply(model)``.

Design: Lightning's ``lightning.pytorch.plugins.TorchSyncBatchNorm`` is the
layer-sync plugin ``Trainer(sync_batchnorm=True)`` uses; its ``apply`` calls
``torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)`` with no process
group. The layers are torch's, run exactly as the ``torch`` adapter runs them
(natively on CUDA, cpu-emulation on CPU), so only the cases that convert a
model (the ``conversion`` family, checkpoint round trips included, and the
layer cases whose layer comes from a converted model) say
something the ``torch`` records do not; every other case is ``unsupported``.
Lightning documents overriding ``apply`` to synchronize within process
groups; the plugin as shipped takes none, so cases that need a subgroup are
``unsupported`` (as for ``mmengine``). Its ``revert`` (SyncBatchNorm back to a
plain ``_BatchNormXd``, done when a Trainer's DDP or FSDP strategy tears down)
is this adapter's revert: the ``revert`` scenario's cases
(``conversion/revert/*``) run it after a training step.
"""

from __future__ import annotations

from harness.impls.base import Capabilities
from harness.impls.torch_layer import TorchLayerAdapter


class LightningImpl(TorchLayerAdapter):
    """``torch.nn.SyncBatchNorm`` layers made by ``lightning.pytorch.plugins.TorchSyncBatchNorm().apply``."""

    name = "lightning"
    package = "lightning"
    probe = ("lightning.pytorch.plugins", "TorchSyncBatchNorm")
    install_hint = "pip install lightning"
    takes_process_group = False
    converter_words = "TorchSyncBatchNorm.apply"

    capabilities = Capabilities(convert=True, revert=True)

    def library_converter(self):
        from lightning.pytorch.plugins import TorchSyncBatchNorm

        return TorchSyncBatchNorm().apply

    def library_revert(self):
        from lightning.pytorch.plugins import TorchSyncBatchNorm

        return TorchSyncBatchNorm().revert
