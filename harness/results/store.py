"""The results store: a directory of JSON Lines files, one per PyTorch build.

Layout: ``<store>/<build key>.jsonl``; the build key is the torch version, the
first 12 digits of its git commit, the device and the backend, e.g.
``2.13.0+cpu-cf30153c4c13-cpu-gloo.jsonl`` (a Python overlay's:
``<commit>-on-<base>``, see :func:`build_key`). One record per line, each line a
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
- :func:`read_file` parses every line. A line that is not a JSON record (the
  torn tail of a killed run) is dropped with a warning naming the line.
  Records of a newer ``schema_version`` refuse the whole file with a message
  naming the harness release needed (:class:`StoreError`, exit 3); older ones
  are migrated on read (:data:`MIGRATIONS`).
- :meth:`Store.prepare` refuses, before any case runs, to append to a file
  that holds newer records, so a run never mixes formats and loses nothing.
- Nothing is ever rewritten in place: the store is append-only. A build may
  hold several records of one (case, impl) (runs without ``--resume``); readers
  that want one take the last (:func:`latest`). Only ``store compact``
  (:mod:`harness.results.compaction`) drops the earlier ones, by writing a new
  file aside under the same lock and renaming it over the old.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Callable, Iterable, Optional

from harness import SCHEMA_VERSION, __version__
from harness.errors import HarnessError, UsageError
from harness.results.records import Record

log = logging.getLogger(__name__)

# schema_version -> function migrating a record dict of that version to the next one.
MIGRATIONS: dict[int, Callable[[dict], dict]] = {}
# The first harness release that writes each schema version (for the refusal message).
HARNESS_FOR_SCHEMA = {1: "0.1.0"}
LOCK_TIMEOUT_S = 60.0


class StoreError(HarnessError):
    """The store cannot be read or written (exit 3)."""


class NotAResultsFile(UsageError):
    """A file given as results holds none: not a run's JSON output, not a store file (exit 2)."""


_OVERLAY = re.compile(r"^overlay of ([0-9a-f]+) on (\S+)(?: \(approximate: .*\))?$")


def build_key(torch_version: str, torch_git_version: str, device: str, backend: str) -> str:
    """File stem of a build: version, commit (12 digits), device, backend; safe as a file name.

    A Python overlay's git version ``overlay of <commit> on <base>`` gives ``<commit>-on-<base>`` (12
    digits each), e.g. ``2.13.0+cpu-3f2a9c0d11aa-on-cf30153c4c13-cpu-gloo``, approximate or not.
    """
    m = _OVERLAY.match(torch_git_version or "")
    commit = f"{m.group(1)[:12]}-on-{m.group(2)[:12]}" if m else (torch_git_version or "unknown")[:12]
    raw = f"{torch_version}-{commit}-{device}-{backend}"
    return re.sub(r"[^A-Za-z0-9.+_-]", "_", raw)


def record_key(record: Record) -> str:
    """The build key a record is stored under."""
    return build_key(record.torch_version, record.torch_git_version, record.device, record.backend)


class Store:
    """A directory of per-build JSON Lines files."""

    def __init__(self, path: os.PathLike | str):
        self.path = Path(path)
        self._checked: set[Path] = set()  # files whose schema this writer has checked

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

    def prepare(self, key: str) -> list[Record]:
        """Check, before a run, that records of build ``key`` can be appended here; return those it holds.

        Raises :class:`StoreError` if the directory is not writable or the
        file holds records of a newer schema (nothing is written then). The
        records come from the one read the check needs (``run --resume``
        uses them: the store is read once per run).
        """
        self._ensure_dir()
        target = self.file_for(key)
        records: list[Record] = []
        if target.exists():
            if not os.access(target, os.W_OK):
                raise StoreError(f"store file {target} is not writable: fix its permissions or choose another "
                                 "store with --store DIR")
            records = read_file(target)  # raises on a newer schema
        self._checked.add(target)
        return records

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


def migrate(d: dict, source: str) -> dict:
    """Bring a record dict to :data:`SCHEMA_VERSION`, or refuse one from a newer harness."""
    version = d.get("schema_version", 1)
    if not isinstance(version, int):
        raise StoreError(f"{source}: schema_version {version!r} is not an integer; the file is not a "
                         "syncbn-harness store")
    if version > SCHEMA_VERSION:
        writer = d.get("harness_version")
        need = HARNESS_FOR_SCHEMA.get(version) or writer
        how = f"{need} or later" if need else f"a release newer than {__version__} (one that reads schema {version})"
        raise StoreError(f"{source} holds records of schema_version {version}"
                         + (f" (written by syncbn-harness {writer})" if writer else "")
                         + f", newer than this harness reads (syncbn-harness {__version__}, schema "
                         f"{SCHEMA_VERSION}): upgrade syncbn-harness to {how}; the file is left untouched")
    while version < SCHEMA_VERSION:
        if version not in MIGRATIONS:
            raise StoreError(f"{source}: no migration from schema_version {version} to {SCHEMA_VERSION} in "
                             f"syncbn-harness {__version__}; re-run those builds into a fresh store")
        d = MIGRATIONS[version](dict(d))
        version = d["schema_version"]
    return d


def read_file(path: os.PathLike | str) -> list[Record]:
    """Records of one JSON Lines file (or a JSON array as printed by ``run --format json``).

    Lines that are not records (a torn tail left by a killed run) are dropped
    with a warning; a record of a newer schema refuses the whole file.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise StoreError(f"no such results file {path}: give a store .jsonl file or the output of "
                         "`run --format json`") from None
    except IsADirectoryError:
        raise StoreError(f"{path} is a directory: give a store .jsonl file inside it") from None
    except OSError as exc:
        raise StoreError(f"cannot read {path}: {exc.strerror}") from None
    if data.lstrip().startswith(b"["):
        return _read_array(path, data)
    lines = data.split(b"\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    out, dropped = [], []
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            d = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            d = None
        if not isinstance(d, dict) or "status" not in d or "case" not in d:
            dropped.append((i, raw))
            continue
        out.append(_record(d, path, i + 1))
    if dropped and not out:
        i, raw = dropped[0]
        raise NotAResultsFile(f"{path} is not a run's JSON output (`syncbn-harness run --format json`) or a store "
                         f".jsonl file: line {i + 1} is {raw[:60]!r}")
    for i, raw in dropped:
        where = "torn last line" if i == last else f"corrupt line {i + 1}"
        _warn_once(path, f"{where} {raw[:60]!r}", "a run killed mid-write leaves one")
    return out


_warned: set[tuple[str, str]] = set()


def _warn_once(path: Path, what: str, why: str) -> None:
    """Log a dropped line once per process, however often the file is read."""
    key = (str(Path(path).resolve()), what)
    if key not in _warned:
        _warned.add(key)
        log.warning("%s: dropping %s (%s)", path, what, why)


def _read_array(path: Path, data: bytes) -> list[Record]:
    try:
        items = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StoreError(f"{path} is not valid JSON ({exc}); expected the output of `run --format json` "
                         "or a store .jsonl file") from None
    if not isinstance(items, list) or not all(isinstance(d, dict) for d in items):
        raise StoreError(f"{path}: expected a JSON array of records, as printed by `run --format json`")
    return [_record(d, path, i + 1) for i, d in enumerate(items)]


def _record(d: dict, path: Path, where: int) -> Record:
    d = migrate(d, str(path))
    try:
        return Record.from_dict(d)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise StoreError(f"{path}: record {where} is not a syncbn-harness record ({type(exc).__name__}: {exc}); the "
                         f"file's other records are intact: fix or delete that line, or move the file out of the "
                         "store") from None


def latest(records: Iterable[Record]) -> list[Record]:
    """One record per (build, impl, case): the last one appended (a re-run supersedes earlier ones)."""
    out: dict[tuple[str, str, str], Record] = {}
    for r in records:
        key = (record_key(r), r.impl, r.case)
        out.pop(key, None)  # keep insertion order of the latest
        out[key] = r
    return list(out.values())
