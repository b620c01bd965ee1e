"""Which latest records a question to the store takes (:class:`Where`): typed conditions, no SQL.

A question (:class:`harness.results.store.Store`'s ``latest``, ``count``,
``pairs``) names its records by these fields; the store's index
(:mod:`harness.results.index`) is the one module that turns them into a query.
Apart from both so that neither imports the other at its top.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Where:
    """Which latest records a question takes: every given condition holds (none given: all of them)."""

    statuses: tuple[str, ...] = ()
    impl: Optional[str] = None
    build: Optional[str] = None
    compiled: Optional[bool] = None
    has_metrics: Optional[bool] = None
    known: Optional[bool] = None  # a failure the known-issues file expects
    native: Optional[bool] = None  # recorded in the 'native' mode (the implementation's own kernels)
