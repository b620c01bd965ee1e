"""A library's own function or method, recompiled from its installed source with ``[find, replace]`` edits.

This is how a third-party fix is undone without copying its code: the installed library's source is read with
``inspect``, each edit puts back what the lines were before the fix (each ``find`` must occur exactly once: a
library that has moved on fails loudly, naming the text), and the result is compiled in the library module's own
globals, so every other name it uses is the library's. The undone plugins (``undone_apex``, ``undone_detectron2``)
are built from these.
"""

from __future__ import annotations

import inspect
import sys
import textwrap


def edited_source(func, edits) -> str:
    """``func``'s source (dedented) with each ``[find, replace]`` done once."""
    src = textwrap.dedent(inspect.getsource(func))
    for find, by in edits:
        n = src.count(find)
        if n != 1:
            raise RuntimeError(f"{func.__module__}.{func.__qualname__}: the edit's text {find!r} occurs {n} times "
                               "in the installed source, not once: this build's code differs from the one the "
                               "edit was written for")
        src = src.replace(find, by)
    return src


def edited_function(func, edits, **names):
    """Module-level ``func`` recompiled with ``edits``; ``names`` rebind globals for it (its own name is rebound
    to the result, so a recursive function recurses into the edited copy)."""
    scope = dict(sys.modules[func.__module__].__dict__)
    scope.update(names)
    code = compile(edited_source(func, edits), f"<{func.__module__}.{func.__qualname__}, edited>", "exec")
    exec(code, scope)  # noqa: S102 - the installed library's own source, edited
    return scope[func.__name__]


def edited_method(cls, name: str, edits):
    """``cls.<name>`` recompiled with ``edits``, to be set on a subclass of ``cls``. A zero-argument ``super()`` in
    it is written ``super(cls, self)``, so it still reaches what the original reached."""
    func = getattr(cls, name)
    src = edited_source(func, edits).replace("super()", "super(__edited_class__, self)")
    scope = dict(sys.modules[cls.__module__].__dict__)
    scope["__edited_class__"] = cls
    code = compile(src, f"<{cls.__module__}.{cls.__qualname__}.{name}, edited>", "exec")
    exec(code, scope)  # noqa: S102 - the installed library's own source, edited
    return scope[func.__name__]
