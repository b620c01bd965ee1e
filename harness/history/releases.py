"""Which torch releases a history covers: the latest patch of every minor release in a range.

:func:`minor_releases` is pure: given every version the index offers, it keeps
the newest patch of each minor release from ``first`` to ``last``, preferring a
CPU build (``2.13.0+cpu``) of that patch where the index has one, since the
history runs on the CPU and a CPU wheel is a tenth of a CUDA one.
:func:`newest_installable` asks pip which torch it would install here (pip's
constraints included, so a cap such as ``torch<=2.14.1`` is honoured).
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Optional, Sequence

from packaging.version import InvalidVersion, Version

from harness.bisect import children
from harness.errors import UsageError

PROBE_TIMEOUT_S = 300.0


def minor_releases(versions: Sequence[str], first: str, last: str) -> list[str]:
    """The newest patch of each minor release between ``first`` and ``last`` (inclusive, by minor), oldest first.

    Pre-releases and development builds are left out. ``2.13.0+cpu`` is taken over ``2.13.0`` when both exist.
    """
    try:
        lo, hi = Version(first), Version(last)
    except InvalidVersion as exc:
        raise UsageError(f"release range {first!r}..{last!r}: {exc}; give versions such as 1.13 and 2.14.1") from None
    if lo.release[:2] > hi.release[:2]:
        raise UsageError(f"release range {first}..{last} is empty: the first is newer than the last")
    best: dict[tuple[int, int], Version] = {}
    for text in versions:
        try:
            v = Version(text)
        except InvalidVersion:
            continue
        if v.is_prerelease or v.is_devrelease or v.local not in (None, "cpu"):
            continue
        minor = v.release[:2]
        if not lo.release[:2] <= minor <= hi.release[:2] or (minor == hi.release[:2] and v.public > hi.public
                                                               and len(hi.release) > 2):
            continue
        held = best.get(minor)
        if held is None or v.public > held.public or (v.public == held.public and v.local == "cpu"):
            best[minor] = v
    return [str(best[m]) for m in sorted(best)]


def newest_installable(package: str = "torch", pip_args: Sequence[str] = ()) -> str:
    """The version pip would install here for a bare ``package`` (its configured index and constraints)."""
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps", "--quiet",
           "--report", "-", *pip_args, package]
    try:
        proc = children.run(cmd, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise UsageError(f"`pip install --dry-run {package}` took more than {PROBE_TIMEOUT_S:.0f}s; "
                         "give the newest release with --last") from None
    found: Optional[str] = None
    try:
        found = json.loads(proc.stdout)["install"][0]["metadata"]["version"]
    except (ValueError, KeyError, IndexError, TypeError):
        pass
    if not found:
        raise UsageError(f"pip would install no {package} here ({children.tail(proc.stderr, 2)}); "
                         "give the newest release with --last")
    return found
