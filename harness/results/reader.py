"""The one reader of stored records: a line's dict is migrated to this harness's schema, then made a
:class:`~harness.results.records.Record` by ``Record.from_dict`` (:func:`record_from`). The store's files
(:func:`read_file`) and its index (:mod:`harness.results.index`, for its rows and for the records it reads
back) both read through it, so the format has one reader.

Schema versions: records of a newer ``schema_version`` are refused, naming
the harness release needed (:class:`StoreError`, exit 3); older ones are
migrated on read, one version at a time (:data:`MIGRATIONS`), never rewritten
in the file. Version 2 made a Python overlay's identity a field
(:class:`~harness.results.records.Overlay`, of which the store key is made);
a version-1 record said it only in prose, in its ``torch_git_version``
(``overlay of <commit> on <base>[ (approximate: N compiled files left out)]``),
which the migration parses, once: old stores read and key as before.

Files: :func:`read_file` parses every line. A line that is not a JSON record
(the torn tail of a killed run) is dropped with a warning naming the line,
once per process; a file with no record at all is not a results file
(:class:`NotAResultsFile`).
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Callable

from harness import SCHEMA_VERSION, __version__
from harness.errors import HarnessError, UsageError
from harness.judge import mode
from harness.results.records import Overlay, Record

log = logging.getLogger("harness.results.store")  # what a user sees is the store's reading


class StoreError(HarnessError):
    """The store cannot be read or written (exit 3)."""


class NotAResultsFile(UsageError):
    """A file given as results holds none: not a run's JSON output, not a store file (exit 2)."""


# How schema 1 said an overlay, in its torch_git_version (read by the migration to schema 2 only).
_PROSE = re.compile(r"^overlay of ([0-9a-f]+) on (\S+)( \(approximate: (\d+)?.*\))?$")


def _v1_to_v2(d: dict) -> dict:
    """Schema 2: the overlay a schema-1 ``torch_git_version`` names in prose becomes the ``overlay`` field."""
    gv = d.get("torch_git_version")
    m = _PROSE.match(gv) if isinstance(gv, str) else None
    # "approximate" without its count (never written so) still marks the build approximate: one file at least.
    left_out = (int(m.group(4)) if m.group(4) else 1) if m and m.group(3) else 0
    d["overlay"] = Overlay(m.group(1), m.group(2), left_out).to_dict() if m else None
    d["schema_version"] = 2
    return d


def _v2_to_v3(d: dict) -> dict:
    """Schema 3: a mode with words after it (``"cpu-emulation; DDP's CPU SyncBatchNorm check skipped"``,
    ``"python-fallback (nvtx no-op)"``) becomes the mode and its ``mode_notes``."""
    found, notes = mode.parse(d.get("mode"))
    d["mode"] = found.value if found else None
    d["mode_notes"] = list(notes)
    d["schema_version"] = 3
    return d


# schema_version -> function migrating a record dict of that version to the next one.
MIGRATIONS: dict[int, Callable[[dict], dict]] = {1: _v1_to_v2, 2: _v2_to_v3}
# The first harness release that writes each schema version (for the refusal message).
HARNESS_FOR_SCHEMA = {1: "0.1.0", 2: "0.2.0", 3: "0.3.0"}


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


def looks_like_record(d) -> bool:
    """Whether a parsed line is meant as a record (else it is dropped as a torn or foreign line, not refused)."""
    return isinstance(d, dict) and "status" in d and "case" in d


def record_from(d: dict, path: os.PathLike | str, where: str) -> Record:
    """The record of a stored dict (migrated first); ``where`` names it in the file (``record 3``, ``the line
    at byte 120``) for the :class:`StoreError` that refuses a dict that is not a record."""
    d = migrate(d, str(path))
    try:
        return Record.from_dict(d)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise StoreError(f"{path}: {where} is not a syncbn-harness record ({type(exc).__name__}: {exc}); the "
                         "file's other records are intact: fix or delete that line, or move the file out of the "
                         "store") from None


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
        if not looks_like_record(d):
            dropped.append((i, raw))
            continue
        out.append(record_from(d, path, f"record {i + 1}"))
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
    return [record_from(d, path, f"record {i + 1}") for i, d in enumerate(items)]
