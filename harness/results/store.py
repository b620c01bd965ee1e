"""The results store: a directory of JSON Lines files, one per PyTorch build, and the questions it answers.

Layout: ``<store>/<build key>.jsonl``; the build key is the torch version, the
first 12 digits of its git commit, the device and the backend, e.g.
``2.13.0+cpu-cf30153c4c13-cpu-gloo.jsonl`` (a Python overlay's:
``<commit>-on-<base>``, made of the record's ``overlay`` field, see
:func:`build_key`). One record per line, each line a
record's ``to_dict()`` plus ``harness_version`` (the release that wrote it, so
that an older harness can name the release it needs). A ``<key>.jsonl.lock``
file beside each store file serializes writers.

Protocol:
- :meth:`Store.append` writes one whole line with a single ``write`` on a file
  opened ``O_APPEND``, under a file lock, then fsyncs (and fsyncs the
  directory when it created the file). A run killed at any moment loses at
  most the record in flight; concurrent writers (two runs, or torchrun's rank
  0 beside a local run) never interleave lines.
- A writer killed mid-line leaves a torn tail without a newline; the next
  append starts on a fresh line, so the torn fragment stays a line of its own.
- Lines are read by :mod:`harness.results.reader` (the format's one reader): a
  line that is not a JSON record (the torn tail of a killed run) is dropped;
  records of a newer ``schema_version`` refuse the whole file with a message
  naming the harness release needed (:class:`StoreError`, exit 3); older ones
  are migrated on read.
- :meth:`Store.prepare` refuses, before any case runs, to append to a file
  that holds newer records, so a run never mixes formats and loses nothing.
- Nothing is ever rewritten in place: the store is append-only. A build may
  hold several records of one (case, impl) (runs without ``--resume``); readers
  read the last (:meth:`Store.latest`). Only ``store compact``
  (:mod:`harness.results.compaction`) drops the earlier ones, by writing a new
  file aside under the same lock and renaming it over the old.

Questions: what readers want of a store (``run --resume``, ``report``,
``diff``, ``gate``) is asked of :class:`Store` by name, over the latest record
of each (build, impl, case): :meth:`Store.latest` (the records, in a named
order), :meth:`Store.count`, :meth:`Store.tally`, :meth:`Store.sample` and a
few more, each narrowed by a :class:`Where`. The store's index
(:mod:`harness.results.index`, derived and deletable) answers them; it is
opened at the first question and brought up to date once per :class:`Store`
(only the one build's file when the question names a build), so a
:class:`Store` that asks is closed after (``with Store(dir) as store``).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Iterable, Iterator, Optional

from harness import __version__
from harness.errors import UsageError
from harness.results.reader import StoreError, read_file
from harness.results.records import Overlay, Record
from harness.results.where import Where

LOCK_TIMEOUT_S = 60.0
__all__ = ["LOCK_TIMEOUT_S", "Store", "StoreError", "Where", "build_key", "fsync_dir", "latest", "read_file",
           "record_key"]


def build_key(torch_version: str, torch_git_version: str, device: str, backend: str,
              overlay: Optional[Overlay] = None) -> str:
    """File stem of a build: version, commit (12 digits), device, backend; safe as a file name.

    A Python overlay (``overlay``) stands for the commit as ``<commit>-on-<base>`` (12 digits each, see
    :meth:`Overlay.key`), e.g. ``2.13.0+cpu-3f2a9c0d11aa-on-cf30153c4c13-cpu-gloo``, approximate or not.
    """
    commit = overlay.key() if overlay else (torch_git_version or "unknown")[:12]
    raw = f"{torch_version}-{commit}-{device}-{backend}"
    return re.sub(r"[^A-Za-z0-9.+_-]", "_", raw)


def record_key(record: Record) -> str:
    """The build key a record is stored under."""
    return build_key(record.torch_version, record.torch_git_version, record.device, record.backend, record.overlay)


class Store:
    """A directory of per-build JSON Lines files."""

    def __init__(self, path: os.PathLike | str):
        self.path = Path(path)
        self._checked: set[Path] = set()  # files whose schema this writer has checked
        self._index = None  # the index answering this store's questions, opened at the first one
        self._fresh: set[Optional[str]] = set()  # what it has brought up to date: build keys, None for all

    def close(self) -> None:
        """Close the index the questions opened (if any)."""
        if self._index is not None:
            self._index.close()
            self._index = None
            self._fresh.clear()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _ensure_dir(self) -> None:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"store directory {self.path} cannot be created ({exc.strerror}): "
                             "choose another with --store DIR") from None
        if not os.access(self.path, os.W_OK | os.X_OK):
            raise StoreError(f"store directory {self.path} is not writable: choose another with --store DIR")

    def file_for(self, key: str) -> Path:
        """The JSON Lines file of build ``key``."""
        return self.path / f"{key}.jsonl"

    def prepare(self, key: str) -> None:
        """Check, before a run, that records of build ``key`` can be appended here.

        Raises :class:`StoreError` if the directory is not writable or the
        file holds records of a newer schema, or a JSON line the reader refuses
        as a record (a torn tail is skipped; nothing is written then). The check brings the build's rows of the
        index up to date (only what was appended since), so that ``run
        --resume`` then reads its latest records (:meth:`latest`) without
        reading the file again.
        """
        self._ensure_dir()
        target = self.file_for(key)
        if target.exists() and not os.access(target, os.W_OK):
            raise StoreError(f"store file {target} is not writable: fix its permissions or choose another "
                             "store with --store DIR")
        if target.exists():
            from harness.results.index import Index

            with Index(self.path) as index:
                index.update(only=key)  # raises on a newer schema, naming the release needed
        self._checked.add(target)

    def append(self, record: Record) -> Path:
        """Append one record to its build's file, durably (one line, one write, fsync)."""
        from filelock import FileLock, Timeout

        key = record_key(record)
        target = self.file_for(key)
        if target not in self._checked:  # checked once per store object, not once per record
            self.prepare(key)
        d = record.to_dict()
        d["harness_version"] = __version__
        line = (json.dumps(d, sort_keys=True, allow_nan=False) + "\n").encode()
        lock = str(target) + ".lock"
        try:
            with FileLock(lock, timeout=LOCK_TIMEOUT_S):
                created = not target.exists()
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                try:
                    size = os.fstat(fd).st_size
                    if size and _last_byte(target, size) != b"\n":
                        line = b"\n" + line  # a killed writer left a torn tail: keep it on its own line
                    _write_all(fd, line)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                if created:
                    fsync_dir(self.path)
            self._fresh.difference_update({key, None})  # the next question reads this line too
        except Timeout:
            raise StoreError(f"store file {target} stayed locked for {LOCK_TIMEOUT_S:.0f}s ({lock}): another "
                             "process holds it; wait for it or remove a stale lock file") from None
        except OSError as exc:
            raise StoreError(f"cannot append to store file {target}: {exc.strerror}; choose another store with "
                             "--store DIR") from None
        return target

    def builds(self) -> list[str]:
        """Build keys present in the store, sorted."""
        if not self.path.is_dir():
            return []
        return sorted(p.name[:-len(".jsonl")] for p in self.path.glob("*.jsonl"))

    def read(self, key: Optional[str] = None) -> list[Record]:
        """Every record of one build (or of all builds), migrated to the current schema."""
        keys = [key] if key else self.builds()
        out = []
        for k in keys:
            if self.file_for(k).exists():
                out.extend(read_file(self.file_for(k)))
        return out

    def resolve_build(self, name: str) -> str:
        """The build key ``name`` stands for: a key present here, or an unambiguous prefix of one."""
        builds = self.builds()
        if name in builds:
            return name
        if name.endswith(".jsonl") and name[:-len(".jsonl")] in builds:
            return name[:-len(".jsonl")]
        matches = [b for b in builds if b.startswith(name)]
        if len(matches) == 1:
            return matches[0]
        if not builds:
            raise UsageError(f"build {name!r}: the store {self.path} holds no build; run `syncbn-harness run "
                             f"--store {self.path}` first or choose another with --store DIR")
        if matches:
            raise UsageError(f"build {name!r} is ambiguous in {self.path}: it starts {', '.join(matches)}; give "
                             "more of the key")
        raise UsageError(f"build {name!r} matches no build in {self.path}: choose one of {', '.join(builds)} "
                         "(or an unambiguous prefix)")

    # ------------------------------------------------------------------ questions (answered by the index)

    def _asked(self, build: Optional[str] = None):
        """The index, brought up to date for a question: ``build``'s file only when it names one, else every
        file; once per :class:`Store` (and again after this store appended)."""
        from harness.results.index import Index

        if self._index is None:
            self._index = Index(self.path)
        if None not in self._fresh and build not in self._fresh:
            self._index.update(only=build)
            self._fresh.add(build)
        return self._index

    def latest(self, where: Optional[Where] = None, *, order: str = "stored",
               limit: Optional[int] = None) -> Iterator[Record]:
        """The latest record of each (build, impl, case) matching ``where``: the last one appended (a re-run
        supersedes earlier ones), in the named ``order`` (``stored``: as appended; ``failing``: known issues
        last; ``by-impl``; ``sample``: out of tolerance first, then a fixed pseudo-random order), at most
        ``limit``. Only these records are parsed; superseded ones never are."""
        where = where or Where()
        return self._asked(where.build).latest(where, order=order, limit=limit)

    def count(self, where: Optional[Where] = None) -> int:
        """How many latest records match ``where`` (all of them by default)."""
        where = where or Where()
        return self._asked(where.build).count(where)

    def sample(self, impl: str, n: int) -> list[Record]:
        """Up to ``n`` latest records of ``impl`` that compared tensors, those out of tolerance first, then a
        pseudo-random order that is the same run after run (what a report plots)."""
        return list(self.latest(Where(impl=impl, has_metrics=True), order="sample", limit=n))

    def tally(self) -> list[tuple[str, str, str, str, bool, int]]:
        """``(build, impl, family, status, known issue, count)`` over the latest records."""
        return [(b, i, f, s, bool(k), n) for b, i, f, s, k, n in self._asked().tally()]

    def build_identities(self) -> list[tuple[str, str, Optional[str], int]]:
        """``(build key, torch_git_version, overlaid commit, compiled files left out)`` of every build that holds
        records, by key; the commit is None but for a Python overlay's build (its ``overlay`` field)."""
        return [(b, gv, commit or None, left_out) for b, gv, commit, left_out in self._asked().build_identities()]

    def pairs(self, where: Optional[Where] = None) -> set[tuple[str, str]]:
        """The ``(impl, case)`` pairs of the latest records matching ``where``."""
        where = where or Where()
        return self._asked(where.build).pairs(where)

    def impls(self) -> list[str]:
        """The implementations the store holds records of, sorted."""
        return self._asked().distinct("impl")

    def modes(self) -> dict[str, str]:
        """Each implementation's modes, comma-separated."""
        return self._asked().modes()


def _write_all(fd: int, data: bytes) -> None:
    while data:
        n = os.write(fd, data)
        data = data[n:]


def _last_byte(path: Path, size: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(size - 1)
        return f.read(1)


def fsync_dir(path: Path) -> None:
    """fsync a folder (its entries: a created or renamed file); silently a no-op where that cannot be done."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems cannot fsync a directory; the file itself is synced
    finally:
        os.close(fd)


def latest(records: Iterable[Record]) -> list[Record]:
    """One record per (build, impl, case) of a list read from a file that is not a store (a baseline, a run's
    JSON output, :meth:`Store.read`'s every record): the last one, as :meth:`Store.latest` takes it."""
    out: dict[tuple[str, str, str], Record] = {}
    for r in records:
        key = (record_key(r), r.impl, r.case)
        out.pop(key, None)  # keep insertion order of the latest
        out[key] = r
    return list(out.values())
