"""What the harness cache holds, by kind, and pruning it without touching what is in use.

The cache (:func:`harness.paths.cache_root`) grows with every torch build,
bisection and compile: :data:`KINDS` names each kind's folder and how deep its
entries sit (an overlay is ``overlays/<binary>-<base>/<commit>``; an
environment ``envs/<name>``). An entry is one folder (or file) that is made,
used and removed as a whole; its *last use* is the newest modification time
among it and its direct children (what making or running in it touches).

``cache prune`` removes entries older than ``--older-than`` and, with
``--max-size``, the least recently used until the total fits. Protocol, per
entry, so that a prune is safe beside a running harness:

1. take the entry's own lock (``<entry>.lock``, the one its maker holds while
   making it) without waiting; an entry being made is skipped;
2. skip an entry a live process holds: its working folder, executable, an open
   file or a mapped library inside the entry (read from ``/proc``; a running
   bisection's interpreter, a rank that loaded the kernels);
3. remove it while holding the lock (the lock file goes with it).

Skipped entries are reported with the reason.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

from harness.errors import UsageError
from harness.paths import CACHE_FOLDERS, cache_root

# kind -> (folder under the cache, depth of its entries below that folder)
# How deep each kind's entries sit below its folder (harness.paths.CACHE_FOLDERS names the folders): uv's cache
# of unpacked wheels is one entry (envs link in); an overlay is <binary>-<base>/<commit>; a bisection's
# verdicts and stores are bisect/<what>/<entry>.
DEPTHS = {"kernels": 1, "environments": 1, "overlays": 2, "compile": 1, "bisect": 2, "logs": 1, "torchrun": 1,
          "indexes": 1, "uv": 0, "apex": 1, "sources": 1}
KINDS = {kind: (CACHE_FOLDERS[kind], depth) for kind, depth in DEPTHS.items()}
LOCKED = ("kernels", "environments", "overlays", "apex")  # kinds whose maker holds <entry>.lock while making it
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$", re.I)
_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.I)


@dataclass
class Entry:
    """One cache entry: its kind, path, bytes and last use (epoch seconds)."""

    kind: str
    path: Path
    bytes: int
    last_use: float


def parse_size(text: str) -> int:
    """``20G``, ``500M``, ``1.5T``, ``1024`` (bytes) as bytes; a usage error naming the forms otherwise."""
    m = _SIZE.match(text)
    if not m:
        raise UsageError(f"--max-size {text!r} is not a size: give a number with K, M, G or T (e.g. 20G)")
    return int(float(m.group(1)) * 1024 ** " KMGT".index((m.group(2) or " ").upper()))


def parse_age(text: str) -> float:
    """``30d``, ``12h``, ``2w``, ``90m`` as seconds; a usage error naming the forms otherwise."""
    m = _AGE.match(text)
    if not m:
        raise UsageError(f"--older-than {text!r} is not an age: give a number with s, m, h, d or w (e.g. 30d)")
    return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[m.group(2).lower()]


def _size(path: Path) -> int:
    if path.is_symlink() or not path.is_dir():
        return path.lstat().st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def _last_use(path: Path) -> float:
    newest = path.lstat().st_mtime
    if path.is_dir() and not path.is_symlink():
        for child in path.iterdir():
            try:
                newest = max(newest, child.lstat().st_mtime)
            except OSError:
                pass
    return newest


def entries(kinds: Sequence[str] = (), root: Optional[Path] = None) -> list[Entry]:
    """Every entry of the given kinds (default all), oldest last use first."""
    root = root or cache_root()
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise UsageError(f"--kind {unknown[0]!r} is not a kind of cache entry: choose among {', '.join(KINDS)}")
    out = []
    for kind in kinds or KINDS:
        folder, depth = KINDS[kind]
        level = [root / folder] if (root / folder).is_dir() else []
        for _ in range(depth):
            level = [c for d in level if d.is_dir() and not d.is_symlink() for c in sorted(d.iterdir())]
        for path in level:
            if path.name.endswith(".lock"):
                continue
            try:
                out.append(Entry(kind, path, _size(path), _last_use(path)))
            except OSError:
                continue  # removed meanwhile
    return sorted(out, key=lambda e: e.last_use)


def holders(paths: Iterable[Path]) -> dict[Path, int]:
    """Of ``paths``, those a live process holds (cwd, executable, an open file or a mapped file inside): pid each."""
    prefixes = {str(p.resolve()) + os.sep: p for p in paths}
    found: dict[Path, int] = {}
    proc = Path("/proc")
    if not proc.is_dir() or not prefixes:
        return found
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit() or int(pid_dir.name) == os.getpid():
            continue
        held: list[str] = []
        for link in ("cwd", "exe"):
            try:
                held.append(os.readlink(pid_dir / link))
            except OSError:
                pass
        try:
            held += [os.readlink(fd) for fd in (pid_dir / "fd").iterdir()]
        except OSError:
            pass
        try:
            with open(pid_dir / "maps") as f:
                held += [line.split(None, 5)[5].strip() for line in f if line.count(" ") >= 5 and "/" in line]
        except (OSError, IndexError):
            pass
        for target in held:
            for prefix, path in prefixes.items():
                if (target + os.sep).startswith(prefix):
                    found.setdefault(path, int(pid_dir.name))
    return found


@dataclass
class Pruned:
    """What a prune removed and what it left, with why."""

    removed: list[Entry]
    skipped: list[tuple[Entry, str]]


def prune(kinds: Sequence[str] = (), older_than: Optional[float] = None, max_size: Optional[int] = None,
          dry_run: bool = False, root: Optional[Path] = None, now: Optional[float] = None) -> Pruned:
    """Remove entries last used more than ``older_than`` seconds ago, then the least recently used until the
    total is at most ``max_size`` bytes (see the module docstring for what is never removed)."""
    from filelock import FileLock, Timeout

    if older_than is None and max_size is None:
        raise UsageError("cache prune needs --older-than AGE or --max-size SIZE (or both): say what to remove")
    now = time.time() if now is None else now
    listed = entries(kinds, root)
    chosen = [e for e in listed if older_than is not None and now - e.last_use > older_than]
    if max_size is not None:
        total = sum(e.bytes for e in listed) - sum(e.bytes for e in chosen)
        for e in listed:  # oldest first
            if total <= max_size:
                break
            if e not in chosen:
                chosen.append(e)
                total -= e.bytes
    held = holders(e.path for e in chosen)
    out = Pruned([], [])
    for e in chosen:
        if e.path in held:
            out.skipped.append((e, f"in use by process {held[e.path]}"))
            continue
        if dry_run:
            out.removed.append(e)
            continue
        # The lock file stays: a process waiting on it must not end up holding a lock on a removed file.
        lock = FileLock(str(e.path) + ".lock") if e.kind in LOCKED else None
        try:
            if lock is not None:
                lock.acquire(timeout=0)
        except Timeout:
            out.skipped.append((e, "locked: being made"))
            continue
        try:
            if e.path.is_dir() and not e.path.is_symlink():
                shutil.rmtree(e.path)
            else:
                e.path.unlink()
            out.removed.append(e)
        except OSError as exc:
            out.skipped.append((e, f"cannot remove: {exc.strerror}"))
        finally:
            if lock is not None:
                lock.release()
    return out
