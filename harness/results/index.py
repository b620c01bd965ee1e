"""A derived, deletable SQLite index of a store: what ``report`` needs of every record, in bounded memory.

The ``.jsonl`` files stay the truth (and the CI artifact, readable with
``jq``); the index only makes reading them cheap. It holds one row per record
line: where the line is (file, byte offset, length) and the few fields a
report groups and sorts by (build, implementation, case, family, status,
known issue, worst err/tol, whether it was compiled), taken from the record
as the store's one reader makes it (:func:`harness.results.reader.record_from`:
migrated, then ``Record.from_dict``). Everything else is read back from the
file at that offset, for the few records a page shows (:meth:`Index.load`).
Deleting the index loses nothing: the next command rebuilds it; an index made
by another index format or another record schema is rebuilt too.

Where: ``<store>/.syncbn-index.sqlite3``; when the store folder is not
writable (a downloaded artifact), ``<cache>/indexes/<hash of the folder>.sqlite3``.
SQLite from the standard library: no server, one file, transactions, and
``GROUP BY`` over a million rows in a second or two.

Bringing it up to date (:meth:`Index.update`), per build file, protocol:
- a file not indexed yet, or whose identity changed (another inode or
  device, or it shrank, or its first bytes differ: a compaction or a copy),
  is indexed from its first byte, its old rows dropped;
- otherwise only the bytes after the last indexed offset are read (the files
  are append-only), and only whole lines (a line still being written, without
  its newline, waits for the next update);
- a line that is not a record (a torn tail) is skipped, as the store's reader
  does; a record of a newer schema, or a line the reader refuses, refuses the
  file (:class:`StoreError`);
- a file gone from the folder has its rows dropped.
Rows are inserted in batches inside one transaction per file, so an
interrupted update leaves the previous state of that file.

The latest record of each (build, implementation, case), what every reader
reads, is the one with the highest row id (rows are inserted in file order):
:data:`Index.LATEST`, the one definition. The questions are asked of the store
(:class:`harness.results.store.Store`, narrowed by a :class:`~harness.results.where.Where`);
no SQL is written outside this module.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Optional

from harness import SCHEMA_VERSION
from harness.paths import cache_folder
from harness.results.reader import StoreError, looks_like_record, record_from
from harness.results.records import Record
from harness.results.where import Where

NAME = ".syncbn-index.sqlite3"
FORMAT = 3  # of the index itself: a different one is rebuilt
VERSION = FORMAT * 1000 + SCHEMA_VERSION  # rows are made from records of this schema: another one is rebuilt
HEAD = 256  # bytes of a file's start kept to notice a file replaced by another
BATCH = 2000
_COLUMNS = ("file", "offset", "length", "build", "impl", "case_id", "family", "status", "known", "known_link",
            "worst_ratio", "torch_git_version", "compiled", "has_metrics", "mode", "overlay_commit", "left_out")


@dataclass
class Refreshed:
    """What one update did: files read, new rows, files indexed from the start, bytes read."""

    files: int = 0
    rows: int = 0
    reindexed: int = 0
    bytes_read: int = 0


def location(store_dir: Path) -> Path:
    """Where the index of ``store_dir`` lives (see the module docstring)."""
    if os.access(store_dir, os.W_OK | os.X_OK):
        return store_dir / NAME
    digest = hashlib.sha256(str(store_dir.resolve()).encode()).hexdigest()[:16]
    return cache_folder("indexes") / f"{digest}.sqlite3"


def _row(r: Record, file: str, offset: int, length: int) -> tuple:
    """The index's row of record ``r``, at ``offset`` in ``file`` (the columns of :data:`_COLUMNS`)."""
    return (file, offset, length, file[:-len(".jsonl")], r.impl, r.case, r.family, r.status.value, int(r.known),
            r.known_issue.link if r.known_issue else "", r.worst_ratio, r.torch_git_version, int(bool(r.compile)),
            int(bool(r.metrics)), r.mode.value if r.mode else "", r.overlay.commit if r.overlay else "",
            r.overlay.left_out if r.overlay else 0)


class Index:
    """The index of one store folder (see the module docstring)."""

    def __init__(self, store_dir: os.PathLike | str):
        self.store = Path(store_dir)
        self.path = location(self.store)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path, timeout=60, isolation_level=None)  # transactions are explicit
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self._latest = False  # whether temp.latest is made (and up to date)
        self._schema()

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> "Index":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _schema(self) -> None:
        version = self.db.execute("PRAGMA user_version").fetchone()[0]
        if version != VERSION:
            self.db.executescript("DROP TABLE IF EXISTS files; DROP TABLE IF EXISTS records;")
        self.db.executescript(f"""
            CREATE TABLE IF NOT EXISTS files (name TEXT PRIMARY KEY, dev INTEGER, ino INTEGER, size INTEGER,
                                              head BLOB);
            CREATE TABLE IF NOT EXISTS records (id INTEGER PRIMARY KEY, file TEXT, offset INTEGER, length INTEGER,
                build TEXT, impl TEXT, case_id TEXT, family TEXT, status TEXT, known INTEGER, known_link TEXT,
                worst_ratio REAL, torch_git_version TEXT, compiled INTEGER, has_metrics INTEGER, mode TEXT,
                overlay_commit TEXT, left_out INTEGER);
            CREATE INDEX IF NOT EXISTS records_key ON records (build, impl, case_id, id);
            CREATE INDEX IF NOT EXISTS records_file ON records (file);
            PRAGMA user_version = {VERSION};
        """)

    # ------------------------------------------------------------------ bringing it up to date

    def update(self, only: Optional[str] = None) -> Refreshed:
        """Index what the store's files hold beyond what is indexed (see the module docstring); ``only``: the
        build key of the one file to bring up to date (a command that reads one build)."""
        done = Refreshed()
        self._latest = False
        present = sorted(p.name for p in self.store.glob("*.jsonl")) if self.store.is_dir() else []
        if only is not None:
            present = [n for n in present if n == f"{only}.jsonl"]
        for (gone,) in self.db.execute("SELECT name FROM files").fetchall():
            if gone not in present and only is None:
                self.db.execute("BEGIN IMMEDIATE")
                self.db.execute("DELETE FROM records WHERE file = ?", (gone,))
                self.db.execute("DELETE FROM files WHERE name = ?", (gone,))
                self.db.execute("COMMIT")
        for name in present:
            self._update_file(name, done)
        return done

    def _update_file(self, name: str, done: Refreshed) -> None:
        path = self.store / name
        try:
            st = path.stat()
            with open(path, "rb") as f:
                head = f.read(HEAD)
        except OSError:
            return
        # One write transaction, taken before the file's state is read: two processes bringing the same file
        # up to date (a report beside a run) do it one after the other, and an interrupted update leaves the
        # file's rows as they were.
        self.db.execute("BEGIN IMMEDIATE")
        try:
            self._update_locked(name, path, st, head, done)
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def _update_locked(self, name: str, path: Path, st: os.stat_result, head: bytes, done: Refreshed) -> None:
        known = self.db.execute("SELECT dev, ino, size, head FROM files WHERE name = ?", (name,)).fetchone()
        start = 0
        if known is not None:
            dev, ino, size, old_head = known
            same = (dev, ino) == (st.st_dev, st.st_ino) and st.st_size >= size and head[:len(old_head)] == old_head
            if same and st.st_size == size:
                return
            if same:
                start = size
            else:
                done.reindexed += 1
        done.files += 1
        if start == 0:
            self.db.execute("DELETE FROM records WHERE file = ?", (name,))
        end = start
        batch = []
        for offset, line in _lines(path, start):
            end = offset + len(line)
            batch.extend(self._rows(name, path, offset, line))
            if len(batch) >= BATCH:
                self._insert(batch)
                done.rows += len(batch)
                batch = []
        self._insert(batch)
        done.rows += len(batch)
        done.bytes_read += end - start
        self.db.execute("INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?)",
                        (name, st.st_dev, st.st_ino, end, head[:min(HEAD, end)]))

    def _rows(self, name: str, path: Path, offset: int, line: bytes) -> list[tuple]:
        try:
            d = json.loads(line)
        except ValueError:
            return []  # a torn tail: the store's reader drops it too, with its warning
        if not looks_like_record(d):
            return []
        return [_row(record_from(d, path, f"the line at byte {offset}"), name, offset, len(line))]

    def _insert(self, rows: list[tuple]) -> None:
        if rows:
            self.db.executemany(f"INSERT INTO records ({', '.join(_COLUMNS)}) VALUES "
                                f"({', '.join('?' * len(_COLUMNS))})", rows)

    # ------------------------------------------------------------------ queries
    # Every read of the latest records goes through these methods (asked through the Store's questions).

    # The latest record of each (build, impl, case): the one definition. {build} narrows it to one build.
    LATEST = ("SELECT * FROM records WHERE id IN "
              "(SELECT max(id) FROM records WHERE {build} GROUP BY build, impl, case_id)")
    # The orders readers ask for, by name.
    ORDERS = {
        "failing": "known, impl, build, case_id",  # unexpected first
        "by-impl": "impl, build, case_id",
        "stored": "id",  # as appended
        # out of tolerance first, then a fixed pseudo-random order: a sample that is the same run after run
        "sample": "coalesce(worst_ratio, 0) > 1 DESC, (id * 2654435761) % 1000003",
    }

    def _query(self, select: str, where: Optional[Where], tail: str = "", extra: Iterable = ()) -> list[tuple]:
        """``SELECT <select> FROM <the latest records> WHERE <where> <tail>``. One build's latest records
        (``where.build``) are grouped from its rows alone; every build's come from the temporary table
        ``latest``, made once per connection (after :meth:`update`) so that many queries do not each group
        every record."""
        where = where or Where()
        conditions, params = _conditions(where)
        if where.build is not None:
            table, params = f"({self.LATEST.format(build='build = ?')})", (where.build, *params)
        else:
            table = "latest"
            if not self._latest:
                self.db.executescript("DROP TABLE IF EXISTS temp.latest; CREATE TEMP TABLE latest AS "
                                      f"{self.LATEST.format(build='1')}; "
                                      "CREATE INDEX temp.latest_impl ON latest (impl, has_metrics); "
                                      "CREATE INDEX temp.latest_status ON latest (status);")
                self._latest = True
        sql = f"SELECT {select} FROM {table} WHERE {conditions} {tail}"
        return self.db.execute(sql, (*params, *extra)).fetchall()

    def count(self, where: Optional[Where] = None) -> int:
        """How many latest records match ``where`` (all of them by default)."""
        ((n,),) = self._query("count(*)", where)
        return n

    def latest(self, where: Optional[Where] = None, *, order: str = "stored",
               limit: Optional[int] = None) -> Iterator[Record]:
        """The latest records matching ``where`` in the named ``order`` (:data:`ORDERS`), at most ``limit``,
        read back from the store's files."""
        if order not in self.ORDERS:
            raise ValueError(f"order {order!r}: one of {', '.join(self.ORDERS)}")
        tail = f"ORDER BY {self.ORDERS[order]}" + (" LIMIT ?" if limit is not None else "")
        return self.load(self._query("file, offset, length", where, tail, () if limit is None else (limit,)))

    def tally(self) -> list[tuple]:
        """(build, impl, family, status, known, count) over the latest records."""
        return self._query("build, impl, family, status, known, count(*)", None,
                           "GROUP BY build, impl, family, status, known")

    def build_identities(self) -> list[tuple[str, str, str, int]]:
        """(build, torch_git_version, overlaid commit or "", compiled files left out) of every build."""
        return self._query("build, max(torch_git_version), max(overlay_commit), max(left_out)", None,
                           "GROUP BY build ORDER BY build")

    def pairs(self, where: Optional[Where] = None) -> set[tuple[str, str]]:
        """The (impl, case) pairs of the latest records matching ``where``."""
        return set(self._query("DISTINCT impl, case_id", where))

    def distinct(self, column: str) -> list[str]:
        """The values of ``impl`` or ``build`` among the latest records, sorted."""
        if column not in ("impl", "build"):
            raise ValueError(f"distinct({column!r}): impl or build")
        return [v for (v,) in self._query(f"DISTINCT {column}", None, f"ORDER BY {column}")]

    def modes(self) -> dict[str, str]:
        """Each implementation's modes, comma-separated."""
        return dict(self._query("impl, group_concat(DISTINCT mode)", None, "GROUP BY impl"))

    def load(self, locations: Iterable[tuple[str, int, int]]) -> Iterator[Record]:
        """The records at ``(file, offset, length)``, read back from the store's files."""
        handles: dict[str, object] = {}
        try:
            for file, offset, length in locations:
                f = handles.get(file)
                if f is None:
                    f = handles[file] = open(self.store / file, "rb")
                f.seek(offset)
                raw = f.read(length)
                try:
                    d = json.loads(raw)
                except ValueError:
                    raise StoreError(f"{self.store / file} changed under the index at byte {offset}: delete "
                                     f"{self.path} and run again") from None
                yield record_from(d, self.store / file, f"the line at byte {offset}")
        finally:
            for f in handles.values():
                f.close()


def _lines(path: Path, start: int) -> Iterator[tuple[int, bytes]]:
    """Whole lines from byte ``start`` on (a last line without its newline is left for later), with offsets."""
    with open(path, "rb") as f:
        f.seek(start)
        offset = start
        for line in f:
            if not line.endswith(b"\n"):
                return
            if line.strip():
                yield offset, line
            offset += len(line)


def refreshed(store_dir: os.PathLike | str) -> Index:
    """The store's index, brought up to date."""
    index = Index(store_dir)
    try:
        index.update()
    except BaseException:
        index.close()
        raise
    return index


def _conditions(where: Where) -> tuple[str, tuple]:
    """``where`` as SQL conditions over the index's columns, and their parameters."""
    terms, params = [], []
    if where.statuses:
        terms.append(f"status IN ({', '.join('?' * len(where.statuses))})")
        params += list(where.statuses)
    for column, value in (("impl", where.impl), ("build", where.build)):
        if value is not None:
            terms.append(f"{column} = ?")
            params.append(value)
    for column, flag in (("compiled", where.compiled), ("has_metrics", where.has_metrics), ("known", where.known)):
        if flag is not None:
            terms.append(f"{column} = ?")
            params.append(int(flag))
    if where.native is not None:
        terms.append("mode = 'native'" if where.native else "coalesce(mode, '') != 'native'")
    return (" AND ".join(terms) or "1"), tuple(params)
