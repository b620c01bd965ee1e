"""Adapters over torch's own SyncBatchNorm reached through a library: :class:`TorchLayerAdapter`.

Design: timm's converter and its ``SyncBatchNormAct``, mmengine's converter
and Lightning's ``TorchSyncBatchNorm`` plugin all end in
``torch.nn.SyncBatchNorm`` (or a subclass keeping its ``forward``). So each
is the ``torch`` adapter (:class:`~harness.impls.torch_native.TorchImpl`:
native on CUDA, cpu-emulation on CPU, the CUDA contract) with a library in
front, and what differs is declared, not written: the package and the import
that proves it works here, the install hint, whether the library brings a
converter only, and whether that converter takes a process group. This base
turns those declarations into ``version``, ``check_available``,
``check_available_on``, ``repro_binding``, ``unsupported_reason`` and
``converter``. An adapter overrides one narrow method where its library
differs (:meth:`TorchLayerAdapter.says_more_than_torch`,
:meth:`TorchLayerAdapter.library_converter`, and where the library can turn
SyncBatchNorm back into BatchNorm, :meth:`TorchLayerAdapter.library_revert`
with ``revert=True`` in its capabilities).

detectron2's ``NaiveSyncBatchNorm`` is not one of these: it is its own
``BatchNorm2d`` subclass, not torch's layer (:mod:`harness.impls.detectron2`).
"""

from __future__ import annotations

import importlib
from typing import Callable, Optional

from harness.catalog.case import Case
from harness.errors import ImplUnavailable
from harness.impls.base import ReproBinding
from harness.impls.torch_native import TorchImpl

# The scenarios whose every case converts a model (``revert``: and reverts it with the library's own revert).
CONVERTING = ("conversion", "checkpoint", "revert")


class TorchLayerAdapter(TorchImpl):
    """``torch.nn.SyncBatchNorm`` reached through a library; subclasses declare the class attributes below."""

    by_default = False  # each needs a package the harness does not install
    package: str = ""  # the top-level package; its ``__version__`` is the adapter's version
    probe: tuple[str, str] = ("", "")  # (module, name or "") that must import for the adapter to be available
    probe_words: str = ""  # what is not importable, in the reason (default: the package)
    install_hint: str = ""  # what to install, in the reason
    converter_only: bool = True  # the library brings a converter, no layer of its own
    takes_process_group: bool = True  # its converter synchronizes within a process group
    converter_words: str = "converter"  # what refuses a process group, in an error
    repro_code: Optional[str] = None  # a layer's standalone binding of ``SyncBatchNorm`` (converters have none)

    def version(self) -> str:
        """``<package> <version> on torch <version>``."""
        import torch

        return f"{self.package} {importlib.import_module(self.package).__version__} on torch {torch.__version__}"

    def check_available(self) -> None:
        """The probe imports, or :class:`ImplUnavailable` with the exception and the install hint."""
        module, attr = self.probe
        try:
            found = importlib.import_module(module)
            if attr and not hasattr(found, attr):
                raise ImportError(f"cannot import name {attr!r} from {module!r}")
        except Exception as exc:  # noqa: BLE001 - the package missing, or failing to import in any way
            raise ImplUnavailable(f"{self.probe_words or self.package} not importable ({type(exc).__name__}: "
                                  f"{exc}); {self.install_hint}") from exc

    def check_available_on(self, device: str) -> None:
        """The library, then what torch's layer needs on ``device`` (cpu-emulation on CPU)."""
        self.check_available()
        super().check_available_on(device)

    def repro_binding(self) -> Optional[ReproBinding]:
        """A layer's binding (torch's layer underneath: CUDA, or the CPU stand-ins); None for a converter, whose
        cases convert whole models, which a standalone short file does not."""
        if self.repro_code is None:
            return None
        return ReproBinding(self.package, self.repro_code, on_cuda=True)

    def says_more_than_torch(self, case: Case) -> bool:
        """Whether ``case`` runs the library's converter (else it runs torch's layer exactly as ``--impl torch``):
        the converting scenarios, and cases whose layer comes from a converted model."""
        return case.scenario in CONVERTING or bool(case.model)

    def no_group_reason(self, case: Case) -> Optional[str]:
        """Why a converter without a process-group argument cannot run ``case`` (None if it can)."""
        if self.takes_process_group:
            return None
        if case.groups:
            return f"{self.name}'s converter takes no process group: its layers synchronize over the whole world"
        if (case.checkpoint or "").startswith("resume-"):
            return (f"{self.name}'s converter takes no process group, and {case.checkpoint} converts on a subset "
                    "of the ranks (its layers would wait for the whole world)")
        return None

    def unsupported_reason(self, case: Case, device: str) -> Optional[str]:
        """A converter's cases only, then a process group it cannot take, then torch's layer's reasons."""
        if self.converter_only and not self.says_more_than_torch(case):
            return f"{self.name} brings a converter only; its layers are torch.nn.SyncBatchNorm's (see --impl torch)"
        return self.no_group_reason(case) or super().unsupported_reason(case, device)

    def private_ops(self):
        """None: the library brings no ops of its own (torch's are ``--impl torch``'s)."""
        return None

    def library_converter(self) -> Callable:
        """The library's converter: ``(model, process_group)``, or ``(model)`` where it takes no group."""
        return super().converter()

    def library_revert(self) -> Optional[Callable]:
        """The library's revert of a converted model to BatchNorm, ``(model) -> model``, or None (it has none:
        declare ``revert=True`` in the capabilities of an adapter that returns one)."""
        return None

    def revert(self, model):
        """The library's own revert (see :meth:`library_revert`)."""
        revert = self.library_revert()
        if revert is None:
            return super().revert(model)
        return revert(model)

    def converter(self):
        """The library's converter as ``(model, process_group)``; a group it cannot take raises."""
        convert = self.library_converter()
        if self.takes_process_group:
            return convert

        def without_group(model, process_group):
            if process_group is not None:
                raise ImplUnavailable(f"{self.name}'s {self.converter_words} takes no process group (this case "
                                      "should be unsupported)")
            return convert(model)

        return without_group
