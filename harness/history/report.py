"""``report --history``: the history file and its page, from a history store or a history file already made.

From a store that ``history`` filled, :func:`write_history_report` first
writes ``history.jsonl.gz`` (:mod:`harness.history.table`) into the output
folder, then the page (:mod:`harness.history.page`) from that file, so the
page in a repository is always the rendering of the file beside it. Given a
``history.jsonl.gz``, it renders the page only (after a change to the
known-issues file or to the upstream changes, say).
"""

from __future__ import annotations

from pathlib import Path

from harness.errors import UsageError
from harness.history import fixes, page, table
from harness.history.collect import MANIFEST
from harness.results import known_issues

FILE = "history.jsonl.gz"


def write_history_report(source: Path, out_dir: Path) -> list[Path]:
    """Write the history file (from a store) and its page into ``out_dir``; the paths written."""
    written = []
    if source.is_dir():
        if not (source / MANIFEST).is_file():
            raise UsageError(f"{source} holds no {MANIFEST}: give a store that `syncbn-harness history --store` "
                             f"filled, or a {FILE}")
        written.append(table.write(out_dir / FILE, table.rows_from_store(source)))
        source = out_dir / FILE
    try:
        history = table.read(source)
    except (OSError, ValueError, KeyError, TypeError, EOFError) as exc:
        raise UsageError(f"{source} is not a history file ({exc}): give a store `history` filled, or the "
                         f"{FILE} that `report --history STORE` wrote") from None
    return written + page.write_page(history, out_dir, known_issues.load(), fixes.load())
