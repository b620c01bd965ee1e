"""Child processes of a bisection: each in its own process group, with a time limit, reaped on any exit.

A pip install or a ``run`` in another build may start children of its own;
on a timeout, an exception or Ctrl-C the whole group is killed with SIGKILL
and reaped, so nothing outlives the bisection.
"""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
from typing import Optional


def run_group(cmd: list[str], *, timeout: float, **kw) -> int:
    """Run ``cmd`` in its own process group; on timeout kill the whole group, reap it and re-raise."""
    proc = subprocess.Popen(cmd, start_new_session=True, **kw)
    try:
        return proc.wait(timeout=timeout)
    except BaseException:
        kill_group(proc)
        raise


def run(cmd: list[str], *, timeout: float, env: Optional[dict] = None, cwd: Optional[str] = None,
        input=None, text: bool = True) -> subprocess.CompletedProcess:
    """Run ``cmd`` capturing its output, in its own process group, killed and reaped on timeout.

    ``input`` (str, or bytes with ``text=False``) is written to its stdin; ``text=False`` returns bytes.
    """
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE if input is not None else None, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=text, env=env, cwd=cwd, start_new_session=True)
    try:
        out, err = proc.communicate(input=input, timeout=timeout)
    except BaseException:
        kill_group(proc)
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc``'s process group and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.communicate(timeout=10)
    except (subprocess.TimeoutExpired, ValueError):
        proc.kill()
        proc.wait(timeout=10)


def tail(text: str, n: int) -> str:
    """The last ``n`` meaningful lines of a child's output, on one line.

    An indented line continues the one above it (uv wraps its explanation over indented lines, so a last
    line alone may lose the package it names): it is joined to it first."""
    lines: list[str] = []
    for ln in text.strip().splitlines():
        if not ln.strip() or ln.startswith("WARNING: Location"):
            continue
        if ln[:1].isspace() and lines:
            lines[-1] = f"{lines[-1]} {ln.strip()}"
        else:
            lines.append(ln.strip())
    return " | ".join(lines[-n:]) if lines else "no output"


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
