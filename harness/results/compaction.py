"""The store's housekeeping: what each build file holds (:func:`stats`) and keeping only what readers read
(:func:`compact`).

Readers take the latest record of each (implementation, case) of a build
(:meth:`harness.results.store.Store.latest`); every earlier one is *superseded*:
kept by the append-only store, read by nobody. ``store stats`` counts them;
``store compact`` drops them.

Compaction of one file, under the lock every appender takes (so no append is
lost or interleaved), in steps a SIGKILL may interrupt anywhere:

1. read the file's bytes; refuse it (nothing written) if it holds records of a
   newer schema than this harness reads;
2. keep, in file order, the line of the last record of each (implementation,
   case), byte for byte as written (never re-serialized); drop superseded
   records and lines that are not records (a killed writer's torn tail);
3. write the kept lines to ``.<name>.compact-<pid>`` beside the file, fsync it;
4. ``os.replace`` it over the file, then fsync the folder.

Killed before step 4, the file is untouched and the leftover aside file is
removed by the next compaction of that file; killed after, the compacted file
is complete. Either way every latest record is there. Kill points
(:func:`harness.paths.kill_point`, ``compact:<step>``) let the tests prove it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from harness import SCHEMA_VERSION
from harness.errors import UsageError
from harness.paths import kill_point
from harness.results.store import LOCK_TIMEOUT_S, Store, StoreError, fsync_dir

STEPS = ("read", "written-aside", "synced-aside", "replaced")


@dataclass
class FileStats:
    """What one build file holds."""

    key: str
    path: Path
    bytes: int
    records: int  # lines that are records
    latest: int  # distinct (implementation, case): what readers read
    torn: int  # lines that are not records
    newest_schema: int

    @property
    def superseded(self) -> int:
        """Records that a compaction drops."""
        return self.records - self.latest


def _scan(data: bytes) -> tuple[list[tuple[bytes, Optional[tuple]]], int]:
    """Each line with its (impl, case) key (None for a line that is not a record), and the newest schema seen."""
    lines, newest = [], 0
    for raw in data.splitlines(keepends=True):
        key = None
        try:
            d = json.loads(raw)
            if isinstance(d, dict) and isinstance(d.get("case"), str) and isinstance(d.get("impl"), str):
                key = (d["impl"], d["case"])
                newest = max(newest, int(d.get("schema_version") or 1))
        except (ValueError, TypeError):
            pass
        if raw.strip():
            lines.append((raw if raw.endswith(b"\n") else raw + b"\n", key))
    return lines, newest


def file_stats(key: str, path: Path) -> FileStats:
    data = path.read_bytes()
    lines, newest = _scan(data)
    keys = [k for _, k in lines if k is not None]
    return FileStats(key, path, len(data), len(keys), len(set(keys)), len(lines) - len(keys), newest)


def _existing(store_dir: os.PathLike | str) -> Store:
    if not Path(store_dir).is_dir():
        raise UsageError(f"the store {store_dir} does not exist: give the folder `run --store` wrote to")
    return Store(store_dir)


def stats(store_dir: os.PathLike | str) -> list[FileStats]:
    """Per build file: bytes, records, what readers read, superseded and torn lines."""
    store = _existing(store_dir)
    return [file_stats(key, store.file_for(key)) for key in store.builds()]


@dataclass
class Compacted:
    """One file's compaction: lines before and after, bytes before and after, torn lines dropped."""

    key: str
    records_before: int
    records_after: int
    bytes_before: int
    bytes_after: int
    torn_dropped: int


def compact_file(store: Store, key: str) -> Compacted:
    """Compact build ``key``'s file (see the module docstring)."""
    from filelock import FileLock, Timeout

    path = store.file_for(key)
    try:
        with FileLock(str(path) + ".lock", timeout=LOCK_TIMEOUT_S):
            for stale in path.parent.glob(f".{path.name}.compact-*"):
                stale.unlink()  # a compaction killed before its rename
            data = path.read_bytes()
            lines, newest = _scan(data)
            kill_point("compact:read")
            if newest > SCHEMA_VERSION:
                raise StoreError(f"{path} holds records of schema {newest}, newer than this harness reads "
                                 f"({SCHEMA_VERSION}): compact it with the harness that wrote them")
            last = {k: i for i, (_, k) in enumerate(lines) if k is not None}
            kept = [raw for i, (raw, k) in enumerate(lines) if k is not None and last[k] == i]
            aside = path.with_name(f".{path.name}.compact-{os.getpid()}")
            with open(aside, "wb") as f:
                f.write(b"".join(kept))
                kill_point("compact:written-aside")
                f.flush()
                os.fsync(f.fileno())
            kill_point("compact:synced-aside")
            os.replace(aside, path)
            kill_point("compact:replaced")
            fsync_dir(path.parent)
    except Timeout:
        raise StoreError(f"store file {path} stayed locked for {LOCK_TIMEOUT_S:.0f}s: another process is "
                         "writing to it; compact it later") from None
    except OSError as exc:
        raise StoreError(f"cannot compact {path}: {exc.strerror}; nothing was changed") from None
    torn = sum(1 for _, k in lines if k is None)
    return Compacted(key, len(lines) - torn, len(kept), len(data), sum(len(x) for x in kept), torn)


def compact(store_dir: os.PathLike | str, keys: Sequence[str] = ()) -> list[Compacted]:
    """Compact the given builds' files (names as ``report``/``diff`` take them), or every file of the store."""
    store = _existing(store_dir)
    chosen = [store.resolve_build(k) for k in keys] if keys else store.builds()
    return [compact_file(store, key) for key in chosen]
