"""How rank processes start: forked from a forkserver that has torch and the harness imported.

A rank needs torch (a second or more of CPU to import), the harness's rank
modules, the reference kernels and, for the scenarios that build optimizers,
compile or export (:data:`DYNAMO_SCENARIOS`), ``torch._dynamo`` (another second:
``torch.optim`` imports it on the first optimizer) and inductor's compiler
(the last two where no GPU can be reached, see :mod:`harness.engine.warm`). Imported once in the
forkserver, each costs nothing per rank, and restarting a pool after a crash
costs a fork per rank instead of fresh interpreters.

Protocol:
- :func:`prewarm` (no torch import here) starts the forkserver at once, so
  that it imports torch while the parent imports its own: a command calls it
  as early as it knows whether its cases need dynamo (:func:`needs_dynamo`
  answers from the ``--case`` patterns alone, before the catalog is loaded).
  Calling it later, or never, only costs time: the first pool starts the
  forkserver itself with :data:`PRELOAD`.
- The forkserver lives as long as the process that started it, so its preload
  is fixed by the first call; a later call asking for dynamo where the running
  server lacks it changes nothing (the ranks then import dynamo themselves).
- Nothing here may fail a run: :mod:`harness.engine.warm_server` and
  :mod:`harness.engine.warm_dynamo`, the preload's last modules, swallow their
  own errors (through :mod:`harness.engine.warm`), and ranks redo whatever
  they could not do.

``SYNCBN_HARNESS_START_METHOD=spawn`` forces fresh interpreters instead; they
are used too, saying so once, when the forkserver's Unix socket would not fit
its path limit under ``TMPDIR`` (:func:`socket_path_fits`).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
from typing import Optional, Sequence

from harness.errors import HarnessError
from harness.paths import START_METHOD, setting

PRELOAD = ("harness.engine.rank", "harness.scenarios.layer", "harness.scenarios.model", "harness.impls.reference",
           "harness.impls.torch_native", "harness.impls.torch_emulation", "harness.impls.apex",
           "harness.impls.plugin", "torch.distributed.nn.functional",
           "torch.distributed._functional_collectives",  # the collective recorder imports it (custom ops)
           "torch.fx.experimental.symbolic_shapes",  # the first backward imports it (and sympy): 0.8 s
           "harness.engine.warm_server")  # the reference kernels, best effort; the server's fast exit
DYNAMO_PRELOAD = ("harness.engine.warm_dynamo",)  # torch._dynamo and inductor's compiler, where no GPU is reachable

# Scenarios whose ranks import torch._dynamo (optimizers, torch.compile, torch.export); no other scenario does.
DYNAMO_SCENARIOS = ("model", "conversion", "checkpoint", "revert", "inference")
# Families whose cases all run a scenario outside DYNAMO_SCENARIOS (tests/engine/test_forkserver.py checks
# this table against the catalog): a selection made only of these starts a forkserver without dynamo.
LIGHT_FAMILIES = ("allgather-shape", "channels-last", "cuda-graph", "degenerate", "mixed-precision", "module-config",
                  "numerics", "private-ops", "scale", "search")

_started_with: Optional[tuple[str, ...]] = None
SOCKET_PATH_MAX = 107  # a Unix socket's path holds 108 bytes with its terminating NUL
_said_spawn = False  # the fall-back to spawn is said once per process


def method(choice: Optional[str] = None) -> str:
    """forkserver where the platform has one and its socket fits (:func:`socket_path_fits`), spawn otherwise or
    when asked for."""
    asked = choice or setting(START_METHOD)
    if asked not in (None, "forkserver", "spawn"):
        raise HarnessError(f"SYNCBN_HARNESS_START_METHOD={asked!r}: use forkserver or spawn")
    if asked == "spawn" or "forkserver" not in mp.get_all_start_methods():
        return "spawn"
    if socket_path_fits():
        return "forkserver"
    path = _socket_path()
    if asked == "forkserver":
        raise HarnessError(f"SYNCBN_HARNESS_START_METHOD=forkserver, but the forkserver's socket {path} would be "
                           f"{len(os.fsencode(path))} bytes, over the {SOCKET_PATH_MAX} a Unix socket path may "
                           "have: set TMPDIR to a shorter folder (or SYNCBN_HARNESS_START_METHOD=spawn)")
    global _said_spawn
    if not _said_spawn:
        _said_spawn = True
        sys.stderr.write(f"syncbn-harness: TMPDIR is too long for the forkserver's socket ({path}): rank processes "
                         "start as fresh interpreters (spawn), which is slower; a shorter TMPDIR avoids it\n")
    return "spawn"



def _socket_path() -> str:
    """Where multiprocessing's forkserver puts its socket: ``<TMPDIR>/pymp-<8 random>/listener-<8 random>``."""
    import tempfile

    return os.path.join(tempfile.gettempdir(), "pymp-" + "x" * 8, "listener-" + "x" * 8)


def socket_path_fits() -> bool:
    """Whether the forkserver's socket path fits a Unix socket (a deep TMPDIR makes ``bind`` fail)."""
    return len(os.fsencode(_socket_path())) <= SOCKET_PATH_MAX


def needs_dynamo(case_patterns: Sequence[str]) -> bool:
    """Whether cases selected by these ``--case`` patterns may import dynamo (no patterns: the default selection,
    which has such cases). A pattern counts as light only when its family part is one of :data:`LIGHT_FAMILIES`
    literally (a wildcard there could match any family)."""
    if not case_patterns:
        return True
    return any(p.split("/", 1)[0] not in LIGHT_FAMILIES for p in case_patterns)


def case_needs_dynamo(case) -> bool:
    """Whether a case's ranks import dynamo: its scenario builds optimizers, or it runs under torch.compile."""
    return case.scenario in DYNAMO_SCENARIOS or bool(case.compile)


def preload(dynamo: bool) -> tuple[str, ...]:
    """The modules the forkserver imports before serving forks."""
    return PRELOAD + (DYNAMO_PRELOAD if dynamo else ())


def start_context(choice: Optional[str] = None, *, dynamo: bool = False):
    """The multiprocessing context ranks start from (see the module docstring)."""
    chosen = method(choice)
    ctx = mp.get_context(chosen)
    if chosen == "forkserver" and _started_with is None:
        ctx.set_forkserver_preload(list(preload(dynamo)))
    return ctx


def prewarm(*, dynamo: bool) -> None:
    """Start the forkserver now (it imports :func:`preload` while this process goes on); a no-op under spawn
    and when one is running."""
    global _started_with
    if method() != "forkserver" or _started_with is not None:
        return
    start_context(dynamo=dynamo)
    from multiprocessing import forkserver

    forkserver.ensure_running()
    _started_with = preload(dynamo)
