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
back to a plain ``_BatchNormXd``) is not driven by a case: the scenarios call
only ``convert`` (the ``revert`` round trip loads the checkpoint into the
unconverted model); ``tests/impls/test_maintained.py`` checks what it keeps.
"""

from __future__ import annotations

from typing import Optional

from harness.catalog.case import Case
from harness.errors import ImplUnavailable
from harness.impls.registry import register
from harness.impls.torch_native import TorchImpl

CONVERTING = ("conversion", "checkpoint")


def no_group_reason(name: str, case: Case) -> Optional[str]:
    """Why a converter without a process-group argument cannot run ``case`` (None if it can)."""
    if case.groups:
        return f"{name}'s converter takes no process group: its layers synchronize over the whole world"
    if (case.checkpoint or "").startswith("resume-"):
        return (f"{name}'s converter takes no process group, and {case.checkpoint} converts on a subset of "
                "the ranks (its layers would wait for the whole world)")
    return None


@register("mmengine")
class MmengineImpl(TorchImpl):
    """``torch.nn.SyncBatchNorm`` layers made by ``mmengine.model.convert_sync_batchnorm``."""

    by_default = False

    def version(self) -> str:
        import mmengine
        import torch

        return f"mmengine {mmengine.__version__} on torch {torch.__version__}"

    def check_available(self) -> None:
        try:
            from mmengine.model import convert_sync_batchnorm  # noqa: F401
        except Exception as exc:  # noqa: BLE001 - mmengine missing or failing to import
            raise ImplUnavailable(f"mmengine not importable ({type(exc).__name__}: {exc}); "
                                  "pip install mmengine") from exc

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
        from mmengine.model import convert_sync_batchnorm

        def convert(model, process_group):
            if process_group is not None:
                raise ImplUnavailable(f"{self.name}'s converter takes no process group (this case should be "
                                      "unsupported)")
            return convert_sync_batchnorm(model, implementation="torch")

        return convert
