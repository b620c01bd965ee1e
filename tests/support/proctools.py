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


HELPERS = (b"resource_tracker", b"multiprocessing.forkserver")


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def children_of(pid: int) -> set[int]:
    """Live (non-zombie) children of ``pid``, ranks or not.

    multiprocessing's resource tracker and forkserver (one each per parent, for its lifetime, and the
    forkserver the parent of forked ranks) are not ranks and are left out; see :func:`rank_processes`.
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
        if not any(h in cmdline for h in HELPERS):
            kids.add(int(entry))
    return kids


def _all_children(pid: int) -> set[int]:
    out = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None and st[1] == pid and st[0] != "Z":
                out.add(int(entry))
    return out


def rank_processes(parent: int) -> set[int]:
    """The rank processes of ``parent``: spawned children, or children of a multiprocessing forkserver below it
    (at any depth: ``check`` runs its cases in a worker process, whose forkserver forks the ranks)."""
    out = {pid for pid in children_of(parent) if b"spawn_main" in _cmdline(pid)}
    for server in descendants(parent):
        if b"multiprocessing.forkserver" in _cmdline(server):
            out |= _all_children(server)
    return out


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid``, at any depth."""
    out, todo = set(), [pid]
    while todo:
        for kid in _all_children(todo.pop()):
            if kid not in out:
                out.add(kid)
                todo.append(kid)
    return out


def wait_until(predicate, timeout: float, interval: float = 0.1) -> bool:
    """Poll ``predicate`` until true or ``timeout`` seconds pass; return its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
