"""Where the harness keeps things, and every ``SYNCBN_HARNESS_*`` environment variable it reads.

One place for the names, so a variable is spelled once and a default
location is changed once. Every other module asks here; none reads these
variables itself.

==============================  ==========================================  ======================================
variable                        what it sets                                default
==============================  ==========================================  ======================================
``SYNCBN_HARNESS_CACHE``        the cache: one folder per kind of entry,    ``$XDG_CACHE_HOME/syncbn-harness``, else
                                named in :data:`CACHE_FOLDERS` (below)      ``~/.cache/syncbn-harness``
``SYNCBN_HARNESS_STORE``        the results store of ``run``, ``check``...   ``./results``
``SYNCBN_HARNESS_REPORTS``      where ``report`` writes                     ``./reports``
``SYNCBN_HARNESS_FOUND``        the file of cases promoted from a search    ``search_found.json`` beside the catalog
``SYNCBN_HARNESS_START_METHOD`` how rank processes start                    ``forkserver`` (``spawn`` where absent)
``SYNCBN_HARNESS_TORCH_PATH``   torch's CPU-emulation path                  chosen per torch version
                                (``module`` or ``function``)
``SYNCBN_HARNESS_PORTABLE``     ``1``: build the kernels without this       unset (native ISA flags)
                                CPU's ISA flags
``SYNCBN_HARNESS_CHECK_WORKER`` internal: set by ``check`` for the worker   unset
                                process it runs the cases in
``SYNCBN_HARNESS_KILL_AT``      tests only: a point (``compact:<step>``)     unset
                                at which the process kills itself with
                                SIGKILL (:func:`kill_point`)
==============================  ==========================================  ======================================

The cache's folders (:data:`CACHE_FOLDERS`, kind -> folder): built kernels
(``kernels/``), bisection environments (``envs/``), overlaid commits
(``overlays/``), inductor's compiled code (``inductor/``), a bisection's
verdicts and stores (``bisect/``), a failing case's rank logs (``logs/``),
torchrun's job folders (``torchrun/``), the stores' indexes (``indexes/``),
uv's cache of unpacked wheels (``uv/``), apex builds (``apex/``) and torch
releases' SyncBatchNorm files for ``undo fixes`` (``sources/``).

Protocol: each function reads its variable when called (never at import),
so a test or a child process that sets one sees it. (``.ci/gpu-suite.sh``
reads ``SYNCBN_HARNESS_GPU_BUDGET_S`` and ``nox -s gpu`` reads
``SYNCBN_HARNESS_GPU_PYTHON``: they belong to those scripts, not to the
harness.)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

CACHE = "SYNCBN_HARNESS_CACHE"
STORE = "SYNCBN_HARNESS_STORE"
REPORTS = "SYNCBN_HARNESS_REPORTS"
FOUND = "SYNCBN_HARNESS_FOUND"
START_METHOD = "SYNCBN_HARNESS_START_METHOD"
CHECK_WORKER = "SYNCBN_HARNESS_CHECK_WORKER"
TORCH_PATH = "SYNCBN_HARNESS_TORCH_PATH"
PORTABLE = "SYNCBN_HARNESS_PORTABLE"
KILL_AT = "SYNCBN_HARNESS_KILL_AT"


def setting(name: str) -> Optional[str]:
    """The value of one of the variables above (None when unset or empty)."""
    return os.environ.get(name) or None


def cache_root() -> Path:
    """The harness's cache folder: ``$SYNCBN_HARNESS_CACHE``, else ``$XDG_CACHE_HOME`` or ``~/.cache``."""
    env = setting(CACHE)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "syncbn-harness"


# The cache's folders, by kind: the one place their names are written (``cache prune`` walks these,
# :mod:`harness.cache` says how deep each kind's entries sit).
CACHE_FOLDERS = {"kernels": "kernels", "environments": "envs", "overlays": "overlays", "compile": "inductor",
                 "bisect": "bisect", "logs": "logs", "torchrun": "torchrun", "indexes": "indexes", "uv": "uv",
                 "apex": "apex", "sources": "sources"}


def cache_folder(kind: str) -> Path:
    """The cache folder of one kind of entry (a key of :data:`CACHE_FOLDERS`)."""
    return cache_root() / CACHE_FOLDERS[kind]


def default_store() -> str:
    """Where results go: ``$SYNCBN_HARNESS_STORE`` or ``./results``."""
    return setting(STORE) or "results"


def default_reports() -> str:
    """Where reports go: ``$SYNCBN_HARNESS_REPORTS`` or ``./reports``."""
    return setting(REPORTS) or "reports"


def found_cases_file(catalog_dir: Path) -> Path:
    """The promoted search cases: ``$SYNCBN_HARNESS_FOUND``, or ``search_found.json`` in ``catalog_dir``."""
    env = setting(FOUND)
    return Path(env) if env else catalog_dir / "search_found.json"


def failure_logs_root() -> Path:
    """Where the rank logs of failing cases are kept (bounded: see :mod:`harness.engine.logs`)."""
    return cache_folder("logs")


def kill_point(name: str) -> None:
    """Die here by SIGKILL when ``$SYNCBN_HARNESS_KILL_AT`` names this point: how the tests prove that a step
    of a durable write (a store compaction) loses nothing whenever it is killed. A no-op otherwise."""
    if setting(KILL_AT) == name:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
