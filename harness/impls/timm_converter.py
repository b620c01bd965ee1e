"""timm's converter (``--impl timm``, opt-in): ``timm.layers.convert_sync_batchnorm`` on torch's SyncBatchNorm.

timm converts its own ``BatchNormAct2d`` into ``SyncBatchNormAct`` (the
activation kept) and every other BatchNorm as torch's converter does; the
layers it makes are ``torch.nn.SyncBatchNorm`` (and subclasses), run exactly
as the ``torch`` adapter runs them (natively on CUDA, cpu-emulation on CPU).
So only the cases of the converting scenarios (the ``conversion`` family,
checkpoint round trips included) say something the ``torch`` records do not;
every other case is ``unsupported`` with that reason. Not in a run's default
list: timm imports torchvision, which must match the installed torch.
"""

from __future__ import annotations

from harness.catalog.case import Case
from harness.impls.torch_layer import CONVERTING, TorchLayerAdapter


class TimmImpl(TorchLayerAdapter):
    """``torch.nn.SyncBatchNorm`` layers made by timm's ``convert_sync_batchnorm``."""

    name = "timm"
    package = "timm"
    probe = ("timm.layers", "")
    install_hint = "install timm and a torchvision built for the installed torch"

    def says_more_than_torch(self, case: Case) -> bool:
        """The converting scenarios only (a layer case with a converted model is left to mmengine/lightning)."""
        return case.scenario in CONVERTING

    def library_converter(self):
        from timm.layers import convert_sync_batchnorm

        return convert_sync_batchnorm
