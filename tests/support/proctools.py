"""Process helpers for the engine's tests, reading /proc (Linux)."""

from __future__ import annotations

import os
import time
from pathlib import Path


def _stat(pid: int):
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[1])  # state, ppid


def alive(pid: int) -> bool:
    """A process exists and is not a zombie."""
    st = _stat(pid)
    return st is not None and st[0] != "Z"


def children_of(pid: int) -> set[int]:
    """Live (non-zombie) children of ``pid``.

    multiprocessing's resource tracker (one per parent, for its lifetime) is not a rank and is left out.
    """
    kids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        st = _stat(int(entry))
        if st is None or st[1] != pid or st[0] == "Z":
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if b"resource_tracker" not in cmdline:
            kids.add(int(entry))
    return kids


def rank_processes(parent: int) -> set[int]:
    """Children of ``parent`` that are multiprocessing-spawned rank processes."""
    out = set()
    for pid in children_of(parent):
        try:
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.add(pid)
        except OSError:
            pass
    return out


def wait_until(predicate, timeout: float, interval: float = 0.1) -> bool:
    """Poll ``predicate`` until true or ``timeout`` seconds pass; return its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
