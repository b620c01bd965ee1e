"""Child processes of a bisection and of the history: a timeout raised, as the callers expect; short output tails.

Each child runs under :func:`harness.procs.run_group` (its own process group,
killed whole with SIGKILL and reaped on a timeout, an exception or Ctrl-C, so
nothing outlives the bisection); here a timeout becomes
:class:`subprocess.TimeoutExpired`, which the bisection's callers turn into
their own errors, and a child's output becomes a one-line tail for messages.
"""

from __future__ import annotations

import datetime
import subprocess
from typing import Optional

from harness import procs


def run_group(cmd: list[str], *, timeout: float, env: Optional[dict] = None, cwd: Optional[str] = None,
              stdout=None, stderr=None) -> int:
    """Run ``cmd`` in its own process group, output to ``stdout``/``stderr`` (files); its exit code. Past
    ``timeout`` the whole group is killed and reaped and :class:`subprocess.TimeoutExpired` raised."""
    done = procs.run_group(cmd, timeout=timeout, env=env, cwd=cwd, stdout=stdout, stderr=stderr)
    if done.timed_out:
        raise subprocess.TimeoutExpired(cmd, timeout)
    return done.code


def run(cmd: list[str], *, timeout: float, env: Optional[dict] = None, cwd: Optional[str] = None,
        input=None, text: bool = True) -> subprocess.CompletedProcess:
    """Run ``cmd`` capturing its output, in its own process group; past ``timeout`` the whole group is killed and
    reaped and :class:`subprocess.TimeoutExpired` raised.

    ``input`` (str, or bytes with ``text=False``) is written to its stdin; ``text=False`` returns bytes.
    """
    done = procs.run_group(cmd, timeout=timeout, env=env, cwd=cwd, input=input, text=text)
    if done.timed_out:
        raise subprocess.TimeoutExpired(cmd, timeout, done.out, done.err)
    return subprocess.CompletedProcess(cmd, done.code, done.out, done.err)


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
    """The time now, UTC, to the second (ISO 8601): when an environment or a verdict was made."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
