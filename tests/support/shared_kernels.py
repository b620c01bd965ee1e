"""A cache folder of a test's own whose built reference kernels are the default cache's.

A test that points ``SYNCBN_HARNESS_CACHE`` at a folder of its own (its logs, torchrun's job folders, a
bisection's environments) would otherwise build the reference kernels again in it: tens of seconds of
compiling that a test's duration hides (the build runs beside the test's other processes).
"""

from __future__ import annotations

from pathlib import Path

from harness.paths import cache_folder


def cache_sharing_kernels(cache: Path) -> Path:
    """Make ``cache`` with a ``kernels`` link to the default cache's (made if missing, so that a first build lands
    there for every test); return it."""
    shared = cache_folder("kernels")
    shared.mkdir(parents=True, exist_ok=True)
    cache.mkdir()
    (cache / "kernels").symlink_to(shared, target_is_directory=True)
    return cache
