"""Rank logs kept only when they matter: a failing case's are moved into the cache, a bounded number of them.

A pool writes its ranks' stdout and stderr to a private temporary folder
(``mkdtemp``). When the pool closes after cases that passed, the folder is
removed: its records already hold what they need. When a task fails (an
error, a crash, a hang), the pool moves the folder to
``<cache>/logs/<UTC time>-ws<N>-<random>/`` (:func:`keep`; the cache is
``$SYNCBN_HARNESS_CACHE``, see :mod:`harness.paths`) and the record's
``logs`` field names it. At most :data:`MAX_KEPT` such folders are kept, the
oldest removed first (:func:`prune`), so a year of CI or a long search
cannot fill a disk. A pool that cannot start keeps its logs there too (its
error names the folder). A pool folder's name carries the harness's pid: a
harness killed with SIGKILL cannot clean up, so the next pool start removes
the folders whose harness is gone (:func:`sweep_orphans`). A torchrun job's faulthandler files live in
``<cache>/torchrun/<run id>-agent<pid>/`` (one per job and node), pruned the same way.
"""

from __future__ import annotations

import datetime
import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional

from harness.errors import HarnessError
from harness.paths import cache_folder, failure_logs_root

MAX_KEPT = 50
POOL_PREFIX = "syncbn-pool-"  # + <harness pid>-ws<N>-<random>: the folder names its owner


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


def sweep_orphans(tmp: Optional[Path] = None) -> int:
    """Remove pool folders in the temporary directory whose harness process is gone; how many went.

    A harness killed with SIGKILL cannot remove its pools' folders (its ranks die with it); the next
    pool start does. A folder whose owner is alive, or whose name names no owner, is left alone.
    """
    gone = 0
    try:
        candidates = list(Path(tmp or tempfile.gettempdir()).glob(f"{POOL_PREFIX}*-ws*"))
    except OSError:
        return 0
    for folder in candidates:
        pid = folder.name[len(POOL_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            gone += 1
    return gone


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: alive, and not ours to clean
    return True


def torchrun_folder(run_id: str) -> Path:
    """The folder a torchrun job's ranks on one node share for their faulthandler files (created, older pruned)."""
    root = cache_folder("torchrun")
    root.mkdir(parents=True, exist_ok=True)
    folder = root / "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id)
    folder.mkdir(mode=0o700, exist_ok=True)
    if folder.is_symlink() or folder.stat().st_uid != os.getuid():
        raise HarnessError(f"{folder} is a link or another user's: remove it (the harness writes crash reports "
                           "only into folders of its own)")
    prune(root, keep_newest=MAX_KEPT, spare=folder)
    return folder


def start_time(pid: int) -> str:
    """When process ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat``), or ``0`` where unknown:
    with the pid, a name no other process on this host has had since boot."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "0"


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0
