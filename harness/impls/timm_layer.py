"""timm's ``SyncBatchNormAct`` as a layer (``--impl timm-layer``, opt-in), with its activation and dropout disabled.

Design: ``timm.layers.SyncBatchNormAct`` subclasses ``torch.nn.SyncBatchNorm``
and keeps its constructor; its ``forward`` is torch's, then ``self.drop`` and
``self.act`` when the module has them. timm makes it only in its
``convert_sync_batchnorm`` from a ``BatchNormAct2d``, copying that layer's
``drop`` and ``act`` (its source says not to create it directly). This adapter
builds it as that conversion does from ``BatchNormAct2d(C, apply_act=False)``
(timm's way of disabling the activation): ``drop`` and ``act`` are
``nn.Identity()``, so the module has ``torch.nn.SyncBatchNorm``'s semantics and
every case of the catalog applies; the code that runs is timm's ``forward``
over torch's. Being torch's layer underneath, it runs like the ``torch``
adapter: natively on CUDA, and on CPU in cpu-emulation, whose "module" path
patches ``torch.nn.SyncBatchNorm.forward``, which timm's ``super().forward``
reaches (the "function" path of old releases replaces the class, which
cannot stand for timm's, so there it raises). Model conversion is the
``timm`` adapter's; here it is ``unsupported``, but the ``model`` scenario's
networks (``ddp``, training-loop and compile chains) run: their norms come
from :meth:`build` (``Capabilities.convert`` counts any case with a model). timm imports torchvision,
which must match the installed torch.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from harness.catalog.case import Case
from harness.errors import ImplUnavailable
from harness.impls.base import Capabilities, construct_like_syncbn
from harness.impls.torch_layer import TorchLayerAdapter


class TimmLayerImpl(TorchLayerAdapter):
    """``timm.layers.SyncBatchNormAct`` with ``act`` and ``drop`` set to ``nn.Identity()``."""

    name = "timm-layer"
    package = "timm"
    probe = ("timm.layers", "SyncBatchNormAct")
    probe_words = "timm's SyncBatchNormAct"
    install_hint = "install timm and a torchvision built for the installed torch"
    converter_only = False
    capabilities = Capabilities()  # torch's layer's, without model conversion (that is --impl timm)
    # A standalone file builds SyncBatchNormAct as this adapter does; it is torch's layer underneath.
    repro_code = ("from timm.layers import SyncBatchNormAct\n\n\n"
                  "def SyncBatchNorm(*args, **kwargs):\n"
                  "    m = SyncBatchNormAct(*args, **kwargs)\n"
                  "    m.drop, m.act = torch.nn.Identity(), torch.nn.Identity()  # BatchNormAct2d(apply_act=False)'s\n"
                  "    return m")

    def unsupported_reason(self, case: Case, device: str) -> Optional[str]:
        """As torch's layer; a ``model`` scenario's network takes its norms from :meth:`build`, not a converter."""
        if case.scenario == "model":
            case = dataclasses.replace(case, model=None)
        return super().unsupported_reason(case, device)

    def build(self, case: Case, process_group, device: str):
        import torch
        from timm.layers import SyncBatchNormAct

        if device == "cpu" and self.path == "function":
            raise ImplUnavailable(f"{self.name}: this torch build's cpu-emulation replaces the SyncBatchNorm class "
                                  "(the function path), which cannot stand for timm's subclass; run on cuda, or "
                                  "a torch whose module path works (SYNCBN_HARNESS_TORCH_PATH=module)")
        module = construct_like_syncbn(SyncBatchNormAct, case, process_group, device)
        module.drop = torch.nn.Identity()  # what convert_sync_batchnorm copies from BatchNormAct2d(apply_act=False)
        module.act = torch.nn.Identity()
        return module
