"""timm's converter (``--impl timm``, opt-in): ``timm.layers.convert_sync_batchnorm`` on torch's SyncBatchNorm.

timm converts its own ``BatchNormAct2d`` into ``SyncBatchNormAct`` (the
activation kept) and every other BatchNorm as torch's converter does; the
layers it makes are ``torch.nn.SyncBatchNorm`` (and subclasses), run exactly
as the ``torch`` adapter runs them (natively on CUDA, cpu-emulation on CPU).
So only the cases that convert a model (the ``conversion`` family, checkpoint
round trips included) say something the ``torch`` records do not; every other
case is ``unsupported`` with that reason. Not in a run's default list: timm
imports torchvision, which must match the installed torch.
"""

from __future__ import annotations

from typing import Optional

from harness.catalog.case import Case
from harness.errors import ImplUnavailable
from harness.impls.registry import register
from harness.impls.torch_native import TorchImpl

CONVERTING = ("conversion", "checkpoint")


@register("timm")
class TimmImpl(TorchImpl):
    """``torch.nn.SyncBatchNorm`` layers made by timm's ``convert_sync_batchnorm``."""

    by_default = False

    def version(self) -> str:
        import timm
        import torch

        return f"timm {timm.__version__} on torch {torch.__version__}"

    def check_available(self) -> None:
        try:
            import timm.layers  # noqa: F401
        except Exception as exc:  # timm missing, or a torchvision that does not match torch
            raise ImplUnavailable(f"timm not importable ({type(exc).__name__}: {exc}); install timm and a "
                                  "torchvision built for the installed torch") from exc

    def check_available_on(self, device: str) -> None:
        self.check_available()
        super().check_available_on(device)

    def unsupported_reason(self, case: Case, device: str) -> Optional[str]:
        if case.scenario not in CONVERTING:
            return "timm brings a converter only; its layers are torch.nn.SyncBatchNorm's (see --impl torch)"
        return super().unsupported_reason(case, device)

    def repro_binding(self) -> None:
        return None  # a converter: its cases convert whole models, beyond a standalone layer file

    def converter(self):
        from timm.layers import convert_sync_batchnorm

        return convert_sync_batchnorm
