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
``unsupported`` (as for ``mmengine``). ``revert`` (SyncBatchNorm back to a
plain ``_BatchNormXd``, done when a Trainer tears down) is checked by
``tests/impls/test_maintained.py``, not by a case: the scenarios only convert.
"""

from __future__ import annotations

from typing import Optional

from harness.catalog.case import Case
from harness.errors import ImplUnavailable
from harness.impls.mmengine_converter import CONVERTING, no_group_reason
from harness.impls.registry import register
from harness.impls.torch_native import TorchImpl


@register("lightning")
class LightningImpl(TorchImpl):
    """``torch.nn.SyncBatchNorm`` layers made by ``lightning.pytorch.plugins.TorchSyncBatchNorm().apply``."""

    by_default = False

    def version(self) -> str:
        import lightning
        import torch

        return f"lightning {lightning.__version__} on torch {torch.__version__}"

    def check_available(self) -> None:
        try:
            from lightning.pytorch.plugins import TorchSyncBatchNorm  # noqa: F401
        except Exception as exc:  # noqa: BLE001 - lightning missing or failing to import
            raise ImplUnavailable(f"lightning not importable ({type(exc).__name__}: {exc}); "
                                  "pip install lightning") from exc

    def repro_binding(self) -> None:
        """None: a converter's cases convert whole models, which a standalone short file does not."""
        return None

    def check_available_on(self, device: str) -> None:
        self.check_available()
        super().check_available_on(device)

    def unsupported_reason(self, case: Case, device: str) -> Optional[str]:
        if case.scenario not in CONVERTING and not case.model:
            return f"{self.name} brings a converter only; its layers are torch.nn.SyncBatchNorm's (see --impl torch)"
        return no_group_reason(self.name, case) or super().unsupported_reason(case, device)

    def converter(self):
        from lightning.pytorch.plugins import TorchSyncBatchNorm

        def convert(model, process_group):
            if process_group is not None:
                raise ImplUnavailable(f"{self.name}'s TorchSyncBatchNorm.apply takes no process group (this case "
                                      "should be unsupported)")
            return TorchSyncBatchNorm().apply(model)

        return convert
