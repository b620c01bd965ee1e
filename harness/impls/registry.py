"""The registry of implementations: built-in adapters by name, plugins by ``MODULE:ATTR`` or entry point.

Built-in adapters are a table, :data:`BUILTINS` (name -> ``module:attribute``),
imported only when a name is resolved or the built-ins are listed, so no
adapter imports the registry and the registry imports no adapter at import
time; :data:`PREFIXES` does the same for the names ``<prefix><rest>``
(``torch@PATH``). :func:`resolve` turns any name a user may give into an
adapter, in any process, so that only names cross process boundaries. An
unknown name is a usage error that lists the valid ones.
"""

from __future__ import annotations

import importlib
from typing import Iterable

from harness.errors import UsageError
from harness.impls.base import Impl

# The built-in adapters: this order is the order of tables and of the default selection (an adapter whose class
# says ``by_default = False`` is opt-in). Each class declares the same ``name``.
BUILTINS = {
    "reference": "harness.impls.reference:ReferenceImpl",
    "torch": "harness.impls.torch_native:TorchImpl",
    "apex": "harness.impls.apex:ApexImpl",
    "timm": "harness.impls.timm_converter:TimmImpl",
    "timm-layer": "harness.impls.timm_layer:TimmLayerImpl",
    "mmengine": "harness.impls.mmengine_converter:MmengineImpl",
    "lightning": "harness.impls.lightning_converter:LightningImpl",
    "lightning-trainer": "harness.impls.lightning_converter:LightningTrainerImpl",
    "detectron2": "harness.impls.detectron2:Detectron2Impl",
    "detectron2-n": "harness.impls.detectron2:Detectron2NImpl",
}
# Names ``<prefix><rest>`` -> the factory of their adapter, given ``rest``.
PREFIXES = {"torch@": "harness.impls.torch_patched:resolve"}
ENTRY_POINT_GROUP = "syncbn_harness.impls"


def _load(spec: str):
    """The object a ``module:attribute`` string of :data:`BUILTINS` or :data:`PREFIXES` names (imported now)."""
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


def builtin_class(name: str) -> type[Impl]:
    """The class of the built-in adapter ``name`` (a class whose ``name`` is another is a bug, and raises)."""
    cls = _load(BUILTINS[name])
    if cls.name != name:
        raise RuntimeError(f"{BUILTINS[name]} is listed as {name!r} but declares name = {cls.name!r}")
    return cls


def builtin_names() -> list[str]:
    """The built-in adapters' names, in the order of tables and of the default selection."""
    return list(BUILTINS)


def default_names() -> list[str]:
    """The built-ins a run takes when no ``--impl`` is given (an adapter with ``by_default = False`` is opt-in)."""
    return [n for n in BUILTINS if builtin_class(n).by_default]


def entry_points() -> dict:
    """Named plugins registered in the ``syncbn_harness.impls`` entry-point group."""
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def known_names() -> list[str]:
    """The built-ins, then the named plugins (entry points) that are not built-ins."""
    return builtin_names() + sorted(n for n in entry_points() if n not in BUILTINS)


def resolve(name: str) -> Impl:
    """The adapter for ``name``: a built-in, a registered plugin, or ``MODULE:ATTR``."""
    if name in BUILTINS:
        return builtin_class(name)()
    from harness.impls.plugin import PluginImpl

    for prefix, make in PREFIXES.items():
        if name.startswith(prefix):
            return _load(make)(name[len(prefix):])
    eps = entry_points()
    if name in eps:
        return PluginImpl(eps[name].value, display_name=name)
    if ":" in name:
        return PluginImpl(name)
    raise UsageError(f"unknown impl {name!r}: choose one of {', '.join(known_names())}, MODULE:ATTR, or "
                     "torch@PATH (a patched copy of torch's SyncBatchNorm)")


def resolve_impls(names: Iterable[str]) -> list:
    """Adapters for ``names``; a plugin that cannot be imported is an error, not a skip."""
    impls = []
    for name in names:
        impl = resolve(name)
        if name not in builtin_names():
            impl.check_available()  # raises ImplUnavailable naming the module and the exception
        impls.append(impl)
    if len({i.name for i in impls}) != len(impls):
        raise UsageError(f"an implementation is selected twice: {[i.name for i in impls]}")
    return impls
