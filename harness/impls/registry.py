"""The registry of implementations: built-in adapters by name, plugins by ``MODULE:ATTR`` or entry point.

Built-in adapters register with :func:`register` (a duplicate name raises);
:func:`resolve` turns any name a user may give into an adapter, in any
process, so that only names cross process boundaries. An unknown name is a
usage error that lists the valid ones.
"""

from __future__ import annotations

from typing import Callable, Iterable

from harness.errors import UsageError
from harness.impls.base import Impl

_REGISTRY: dict[str, Callable[[], Impl]] = {}
ENTRY_POINT_GROUP = "syncbn_harness.impls"


def register(name: str):
    """Class decorator: register an adapter under ``name`` (a duplicate raises)."""

    def deco(cls):
        if name in _REGISTRY:
            raise ValueError(f"implementation {name!r} is registered twice")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def builtin_names() -> list[str]:
    _load_builtins()
    return list(_REGISTRY)


def default_names() -> list[str]:
    """The built-ins a run takes when no ``--impl`` is given (an adapter with ``by_default = False`` is opt-in)."""
    _load_builtins()
    return [n for n, cls in _REGISTRY.items() if getattr(cls, "by_default", True)]


_PREFIXES: dict = {}  # "torch@" -> the factory of the adapter for "torch@PATH", given PATH


def register_prefix(prefix: str):
    """Register a factory for the names ``<prefix><rest>`` (``torch@PATH``); a prefix registered twice raises."""
    def deco(make):
        if prefix in _PREFIXES:
            raise ValueError(f"impl name prefix {prefix!r} registered twice")
        _PREFIXES[prefix] = make
        return make

    return deco


def _load_builtins() -> None:
    # Importing an adapter registers it; this order is the order of tables and of the default selection.
    import harness.impls.reference  # noqa: F401
    import harness.impls.torch_native  # noqa: F401
    import harness.impls.apex  # noqa: F401,I001
    import harness.impls.timm_converter  # noqa: F401,I001
    import harness.impls.timm_layer  # noqa: F401,I001
    import harness.impls.mmengine_converter  # noqa: F401,I001
    import harness.impls.lightning_converter  # noqa: F401,I001
    import harness.impls.detectron2  # noqa: F401,I001
    import harness.impls.torch_patched  # noqa: F401,I001  (torch@PATH)


def entry_points() -> dict:
    """Named plugins registered in the ``syncbn_harness.impls`` entry-point group."""
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def known_names() -> list[str]:
    return builtin_names() + sorted(n for n in entry_points() if n not in _REGISTRY)


def resolve(name: str) -> Impl:
    """The adapter for ``name``: a built-in, a registered plugin, or ``MODULE:ATTR``."""
    _load_builtins()
    if name in _REGISTRY:
        return _REGISTRY[name]()
    from harness.impls.plugin import PluginImpl

    for prefix, make in _PREFIXES.items():
        if name.startswith(prefix):
            return make(name[len(prefix):])
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
