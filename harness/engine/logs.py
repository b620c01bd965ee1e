"""Rank logs kept only when they matter: a failing case's are moved into the cache, a bounded number of them.

A pool writes its ranks' stdout and stderr to a private temporary folder
(``mkdtemp``). When the pool closes after cases that passed, the folder is
removed: its records already hold what they need. When a task fails (an
error, a crash, a hang), the pool moves the folder to
``<cache>/logs/<UTC time>-ws<N>-<random>/`` (:func:`keep`; the cache is
``$SYNCBN_HARNESS_CACHE``, see :mod:`harness.paths`) and the record's
``logs`` field names it. At most :data:`MAX_KEPT` such folders are kept, the
oldest removed first (:func:`prune`), so a year of CI or a long search
cannot fill a disk. A torchrun job's faulthandler files live in
``<cache>/torchrun/<run id>/``, pruned the same way.
"""

from __future__ import annotations

import datetime
import shutil
import tempfile
from pathlib import Path
from typing import Optional

from harness.paths import cache_root, failure_logs_root

MAX_KEPT = 50


def keep(folder: Path, label: str) -> Optional[Path]:
    """Move ``folder`` (a pool's rank logs) under the cache; its new path (None if it could not be moved)."""
    root = failure_logs_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        target = Path(tempfile.mkdtemp(prefix=f"{stamp}-{label}-", dir=root))
        for item in folder.iterdir():
            shutil.move(str(item), target / item.name)
        shutil.rmtree(folder, ignore_errors=True)
    except OSError:
        return None
    prune(root, keep_newest=MAX_KEPT, spare=target)
    return target


def prune(root: Path, keep_newest: int = MAX_KEPT, spare: Optional[Path] = None) -> int:
    """Remove all but the ``keep_newest`` most recent folders in ``root`` (never ``spare``); how many went."""
    try:
        folders = sorted((p for p in root.iterdir() if p.is_dir() and p != spare), key=_mtime, reverse=True)
    except OSError:
        return 0
    gone = 0
    for p in folders[max(0, keep_newest - (spare is not None)):]:
        shutil.rmtree(p, ignore_errors=True)
        gone += 1
    return gone


def torchrun_folder(run_id: str) -> Path:
    """The folder a torchrun job's ranks on one node share for their faulthandler files (created, older pruned)."""
    root = cache_root() / "torchrun"
    root.mkdir(parents=True, exist_ok=True)
    folder = root / "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id)
    folder.mkdir(exist_ok=True)
    prune(root, keep_newest=MAX_KEPT, spare=folder)
    return folder


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0
