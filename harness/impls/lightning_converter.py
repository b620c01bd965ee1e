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

``--impl lightning-trainer`` (:class:`LightningTrainerImpl`) reaches the same
plugin the way a Trainer user does: ``Trainer(strategy=DDPStrategy(),
sync_batchnorm=True)``, the strategy passed by hand. The Trainer hands its
layer sync to the strategy (or not: Lightning#7026, a strategy passed by hand
got none and SyncBN was silently off), and the adapter converts and reverts
with what the strategy holds, the two steps ``DDPStrategy.setup`` and
``teardown`` take around ``fit``. A strategy given no layer sync leaves the
model's BatchNorm as it is, which the conversion cases judge as the
unsynchronized training it is.
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


class LightningTrainerImpl(LightningImpl):
    """The layer sync that ``Trainer(strategy=DDPStrategy(), sync_batchnorm=True)`` gives its strategy."""

    name = "lightning-trainer"
    probe = ("lightning.pytorch.strategies", "DDPStrategy")
    converter_words = "Trainer(sync_batchnorm=True)"

    def layer_sync(self):
        """What a Trainer built with a hand-made DDP strategy and ``sync_batchnorm=True`` leaves on that strategy
        for ``setup`` to apply (None: nothing is converted). Building a Trainer starts no process and joins no
        group; its console banner is silenced."""
        import logging

        from lightning.pytorch import Trainer
        from lightning.pytorch.strategies import DDPStrategy

        quiet = logging.getLogger("lightning.pytorch")
        level, quiet.level = quiet.level, logging.ERROR
        try:
            trainer = Trainer(accelerator="cpu", devices=1, strategy=DDPStrategy(), sync_batchnorm=True, logger=False,
                              enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        finally:
            quiet.level = level
        return trainer.strategy._layer_sync  # what DDPStrategy.setup applies for fit and teardown reverts

    def library_converter(self):
        sync = self.layer_sync()
        return sync.apply if sync is not None else (lambda model: model)

    def library_revert(self):
        sync = self.layer_sync()
        return sync.revert if sync is not None else (lambda model: model)
