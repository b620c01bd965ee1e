"""Plugins: ``MODULE:ATTR``, an ``nn.Module`` class or factory with SyncBatchNorm's constructor.

The constructor signature is ``(num_features, eps=1e-5, momentum=0.1,
affine=True, track_running_stats=True, process_group=None)``. The harness builds
one instance per rank, moves it to the case's device and parameter dtype, and
calls ``forward(input)``. A plugin may set a ``name`` attribute for display,
and ``capabilities`` (a :class:`harness.impls.Capabilities`, or a plain dict of
its fields for a plugin that does not import the harness) to declare limits.
Without them, a ``convert_sync_batchnorm`` classmethod declares model
conversion and a ``revert_sync_batchnorm`` one a revert to BatchNorm; a
constructor without the keyword ``bias`` (nor ``**kwargs``) cannot build a
layer without bias (``bias_off=False``), whatever it declares, nor one
without ``device=`` and ``dtype=`` a layer made in place (``factory_kwargs``). A
``private_ops`` attribute, an object whose attributes are its versions of
torch's five private SyncBN ops, runs the ``private-ops`` family's cases.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Optional

from harness.catalog.case import Case
from harness.errors import PluginUnavailable, UsageError
from harness.impls.base import (Capabilities, Impl, ReproBinding, construct_like_syncbn, takes_bias,
                                takes_keywords)


class PluginImpl(Impl):
    """A user's SyncBN given as ``MODULE:ATTR`` (or a registered entry-point name standing for one)."""

    def __init__(self, spec: str, display_name: Optional[str] = None):
        module, sep, attr = spec.partition(":")
        if not sep or not module or not attr:
            raise UsageError(f"plugin {spec!r} must be MODULE:ATTR, e.g. mypkg.syncbn:SyncBatchNorm")
        self.spec = spec
        self.module_name, self.attr = module, attr
        self.name = display_name or spec
        self._key = display_name or spec
        self._factory = None

    @property
    def key(self) -> str:
        return self._key

    def _load(self):
        if self._factory is None:
            try:
                mod = importlib.import_module(self.module_name)
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:  # noqa: BLE001 - a plugin may fail to import in any way (Ctrl-C aside)
                raise PluginUnavailable(
                    f"plugin {self.spec!r}: importing module {self.module_name!r} failed: "
                    f"{type(exc).__name__}: {exc} (is it on PYTHONPATH?)") from None
            try:
                factory = getattr(mod, self.attr)
            except AttributeError:
                raise PluginUnavailable(f"plugin {self.spec!r}: module {self.module_name!r} has no "
                                      f"attribute {self.attr!r}") from None
            self._factory = factory
            caps = getattr(factory, "capabilities", None)
            if isinstance(caps, dict):  # a plugin that must not import the harness declares a plain dict
                caps = _capabilities(self.spec, caps)
            if isinstance(caps, Capabilities):
                self.capabilities = caps
            else:
                self.capabilities = Capabilities(convert=callable(getattr(factory, "convert_sync_batchnorm", None)),
                                                 revert=callable(getattr(factory, "revert_sync_batchnorm", None)))
            if not takes_bias(factory):  # a constructor without the keyword cannot build a layer without bias
                self.capabilities = dataclasses.replace(self.capabilities, bias_off=False)
            if not takes_keywords(factory, ("device", "dtype")):  # nor one without these a layer made in place
                self.capabilities = dataclasses.replace(self.capabilities, factory_kwargs=False)
            display = getattr(factory, "name", None)
            if isinstance(display, str) and display and self.name == self.spec:
                self.name = display
        return self._factory

    def repro_binding(self) -> ReproBinding:
        line = (f"from {self.module_name} import SyncBatchNorm" if self.attr == "SyncBatchNorm"
                else f"from {self.module_name} import {self.attr} as SyncBatchNorm")
        return ReproBinding(self.module_name.split(".")[0], line, on_cuda=False)

    def version(self) -> Optional[str]:
        """The module's ``__version__``, else its top-level package's (fairscale's for fairscale.experimental.nn)."""
        mod = importlib.import_module(self.module_name)
        top = importlib.import_module(self.module_name.split(".")[0])
        return getattr(mod, "__version__", None) or getattr(top, "__version__", None)

    def check_available(self) -> None:
        self._load()

    def unsupported_reason(self, case: Case, device: str) -> Optional[str]:
        self._load()
        return super().unsupported_reason(case, device)

    def convert(self, model, process_group):
        convert = getattr(self._load(), "convert_sync_batchnorm", None)
        if not callable(convert):
            return super().convert(model, process_group)
        return convert(model, process_group)

    def revert(self, model):
        revert = getattr(self._load(), "revert_sync_batchnorm", None)
        if not callable(revert):
            return super().revert(model)
        return revert(model)

    def private_ops(self):
        """The class's ``private_ops`` attribute: an object with ops of torch's private SyncBN contract, or None."""
        return getattr(self._load(), "private_ops", None)

    def build(self, case: Case, process_group, device: str):
        return construct_like_syncbn(self._load(), case, process_group, device)


def _capabilities(spec: str, declared: dict) -> Capabilities:
    """``Capabilities`` from a plugin's plain dict (``{"double_backward": False, ...}``), unknown keys refused."""
    known = set(Capabilities.__dataclass_fields__)
    unknown = sorted(set(declared) - known)
    if unknown:
        raise PluginUnavailable(f"plugin {spec!r}: capabilities has unknown key {unknown[0]!r}: the keys are "
                                f"{', '.join(sorted(known))}")
    fields = {k: frozenset(v) if isinstance(v, (list, tuple, set)) else v for k, v in declared.items()}
    return Capabilities(**fields)
