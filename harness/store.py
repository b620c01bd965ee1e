"""The results store: a directory of JSON Lines files, one per PyTorch build.

Layout: ``<store>/<build key>.jsonl``; the build key is the torch version, the
first 12 digits of its git commit, the device and the backend, e.g.
``2.13.0+cpu-cf30153c4c13-cpu-gloo.jsonl``. One record per line.

Protocol:
- :meth:`Store.append` writes one whole line with a single ``write`` on a file
  opened ``O_APPEND``, under a file lock, then flushes and fsyncs. A run killed
  at any moment loses at most the record in flight; concurrent writers never
  interleave lines.
- :meth:`Store.read` parses every line. A torn last line (a write cut short
  by a kill) is dropped with a warning. A record of a newer
  ``schema_version`` is refused with a message naming the harness version
  needed; older ones are migrated on read (:data:`MIGRATIONS`).
- Nothing is ever rewritten in place: the store is append-only.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Callable, Iterable, Optional

from harness import SCHEMA_VERSION, __version__
from harness.errors import HarnessError
from harness.records import Record

log = logging.getLogger(__name__)

# schema_version -> (function migrating a record dict of that version to the next)
MIGRATIONS: dict[int, Callable[[dict], dict]] = {}
# The first harness release that writes each schema version (for the refusal message).
HARNESS_FOR_SCHEMA = {1: "0.1.0"}


class StoreError(HarnessError):
    """The store cannot be read or written (exit 3)."""


def build_key(torch_version: str, torch_git_version: str, device: str, backend: str) -> str:
    """File stem of a build: version, commit (12 digits), device, backend; safe as a file name."""
    raw = f"{torch_version}-{(torch_git_version or 'unknown')[:12]}-{device}-{backend}"
    return re.sub(r"[^A-Za-z0-9.+_-]", "_", raw)


def record_key(record: Record) -> str:
    return build_key(record.torch_version, record.torch_git_version, record.device, record.backend)


class Store:
    """A directory of per-build JSON Lines files."""

    def __init__(self, path: os.PathLike | str):
        self.path = Path(path)

    def _ensure_dir(self) -> None:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"store directory {self.path} cannot be created ({exc.strerror}): "
                             "choose another with --store DIR") from None
        if not os.access(self.path, os.W_OK):
            raise StoreError(f"store directory {self.path} is not writable: choose another with --store DIR")

    def file_for(self, key: str) -> Path:
        return self.path / f"{key}.jsonl"

    def append(self, record: Record) -> Path:
        """Append one record to its build's file, durably."""
        from filelock import FileLock

        self._ensure_dir()
        target = self.file_for(record_key(record))
        line = (json.dumps(record.to_dict(), sort_keys=True, allow_nan=False) + "\n").encode()
        with FileLock(str(target) + ".lock", timeout=60):
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                # A previous writer killed mid-line left a torn tail: start on a fresh line.
                size = os.fstat(fd).st_size
                if size and _last_byte(target, size) != b"\n":
                    line = b"\n" + line
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)
        return target

    def builds(self) -> list[str]:
        """Build keys present in the store, sorted."""
        if not self.path.is_dir():
            return []
        return sorted(p.stem for p in self.path.glob("*.jsonl"))

    def read(self, key: Optional[str] = None) -> list[Record]:
        """Every record of one build (or of all builds), migrated to the current schema."""
        keys = [key] if key else self.builds()
        out = []
        for k in keys:
            out.extend(read_file(self.file_for(k)))
        return out


def _last_byte(path: Path, size: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(size - 1)
        return f.read(1)


def migrate(d: dict, source: str) -> dict:
    """Bring a record dict to :data:`SCHEMA_VERSION`, or refuse one from a newer harness."""
    version = d.get("schema_version", 1)
    if version > SCHEMA_VERSION:
        need = HARNESS_FOR_SCHEMA.get(version, f"a release newer than {__version__}")
        raise StoreError(f"{source} holds records of schema_version {version}, newer than this harness "
                         f"({__version__}, schema {SCHEMA_VERSION}): upgrade syncbn-harness to {need} or later")
    while version < SCHEMA_VERSION:
        d = MIGRATIONS[version](d)
        version = d["schema_version"]
    return d


def read_file(path: Path) -> list[Record]:
    """Records of one JSON Lines file (or a JSON array as printed by ``run --format json``)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise StoreError(f"no such results file {path}") from None
    except OSError as exc:
        raise StoreError(f"cannot read {path}: {exc.strerror}") from None
    if text.lstrip().startswith("["):
        try:
            return [Record.from_dict(migrate(d, str(path))) for d in json.loads(text)]
        except json.JSONDecodeError as exc:
            raise StoreError(f"{path} is not valid JSON ({exc}); expected the output of `run --format json` "
                             "or a store .jsonl file") from None
    lines = text.split("\n")
    out = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            last = all(not rest.strip() for rest in lines[i + 1:])
            where = "torn last line" if last else f"corrupt line {i + 1}"
            log.warning("%s: dropping %s (a run killed mid-write leaves one)", path, where)
            continue
        out.append(Record.from_dict(migrate(d, str(path))))
    return out


def completed(records: Iterable[Record]) -> set[tuple[str, str]]:
    """(case, impl) pairs already stored, for ``--resume``."""
    return {(r.case, r.impl) for r in records}
