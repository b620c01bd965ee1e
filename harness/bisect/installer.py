"""What installs a build into its environment: pip, or uv when it is on PATH (``bisect --installer``).

A torch build is gigabytes; pip unpacks every one of them again into each
environment. uv keeps one cache of unpacked wheels and links their files into
each environment (hard links on one filesystem), so a second environment that
shares torch's dependencies (the CUDA libraries, numpy...) costs little time
and disk. Both install into a ``python -m venv --without-pip`` environment
the same way: :func:`install_command` gives the command line and the
environment variables for either.

- ``auto`` (the default): uv if an ``uv`` executable is on PATH, else pip
  (``--installer uv`` also finds the one the ``uv`` wheel installed);
- ``pip``: this interpreter's ``pip --python ENV install --no-compile``, with
  the index options as given (pip reads its own configuration for the rest).
  Without ``--no-compile`` pip writes bytecode for every one of torch's
  thousands of modules, half of an install's time (20 s against 10 s for a
  CPU build); a build's run imports a small part of them, which Python
  compiles on first import, as after uv, which compiles nothing either;
- ``uv``: ``uv pip install --python ENV``, its cache in
  ``<harness cache>/uv`` (so ``cache prune`` sees it), resolving across every
  index as pip does (``--index-strategy unsafe-best-match``). uv does not read
  pip's configuration, so where no index option was given, pip's configured
  ``index-url``, ``extra-index-url`` and ``find-links`` (``pip config list``)
  are passed to it, and an index folder that does not exist is left out (pip
  ignores those with a warning).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

from harness.bisect.builds import IndexOptions
from harness.errors import UsageError
from harness.paths import cache_folder

INSTALLERS = ("auto", "pip", "uv")
CONFIG_TIMEOUT_S = 60


def uv_binary() -> Optional[str]:
    """The ``uv`` on PATH, else the one the ``uv`` wheel installed beside this interpreter, else None."""
    found = shutil.which("uv")
    if found:
        return found
    try:
        from uv import find_uv_bin
    except ImportError:
        return None
    try:
        return find_uv_bin()
    except FileNotFoundError:
        return None


def choose(name: str = "auto") -> str:
    """``pip`` or ``uv`` for ``--installer NAME`` (``uv`` asked for but absent is a usage error)."""
    if name not in INSTALLERS:
        raise UsageError(f"--installer {name!r}: choose among {', '.join(INSTALLERS)}")
    if name == "auto":
        return "uv" if shutil.which("uv") else "pip"
    if name == "uv" and not uv_binary():
        raise UsageError("--installer uv: no `uv` on PATH; install it (pip install uv) or use --installer pip")
    return name


def pip_configuration() -> dict[str, list[str]]:
    """pip's configured ``index-url``, ``extra-index-url`` and ``find-links`` (from ``pip config list``)."""
    try:
        proc = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                              timeout=CONFIG_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    out: dict[str, list[str]] = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition("=")
        name = key.rsplit(".", 1)[-1]
        if name in ("index-url", "extra-index-url", "find-links"):
            values = shlex.split(value.strip().strip("'\""))
            out[name] = list(dict.fromkeys(out.get(name, []) + values))
    return out


def _exists(location: str) -> bool:
    """A remote URL is assumed to answer; a local folder (or ``file://`` URL) must exist."""
    if location.startswith("file://"):
        return Path(location[len("file://"):]).exists()
    if "://" in location:
        return True
    return Path(location).expanduser().exists()


def uv_index_args(index: IndexOptions, configured: Optional[dict[str, list[str]]] = None) -> list[str]:
    """uv's flags for ``index``, or for pip's configuration when ``index`` names no index."""
    args = ["--index-strategy", "unsafe-best-match"]
    if index.pre:
        args += ["--prerelease", "allow"]
    named = index.no_index or index.index_url or index.extra_index_urls or index.find_links
    if named:
        args += ["--no-index"] if index.no_index else []
        args += ["--index-url", index.index_url] if index.index_url else []
        for url in index.extra_index_urls:
            args += ["--extra-index-url", url]
        for d in index.find_links:
            args += ["--find-links", str(Path(d).expanduser().resolve()) if Path(d).expanduser().exists() else d]
        return args
    config = pip_configuration() if configured is None else configured
    for flag, key in (("--index-url", "index-url"), ("--extra-index-url", "extra-index-url"),
                      ("--find-links", "find-links")):
        for value in config.get(key, [])[: 1 if key == "index-url" else None]:
            if _exists(value):
                args += [flag, value]
    return args


def install_command(installer: str, python: Path, args: list[str], index: Optional[IndexOptions]) -> tuple[list, dict]:
    """The command that installs ``args`` into the environment of ``python``, and what to add to its environment.

    ``index`` None: no index options (an editable install of a local folder)."""
    if installer == "uv":
        cmd = [uv_binary() or "uv", "pip", "install", "--python", str(python), *args]
        if index is not None:
            cmd += uv_index_args(index)
        return cmd, {"UV_CACHE_DIR": str(cache_folder("uv")), "UV_NO_PROGRESS": "1"}
    cmd = [sys.executable, "-m", "pip", "--python", str(python), "install", "--disable-pip-version-check",
           "--no-compile", *args]
    if index is not None:
        cmd += index.pip_args()
    return cmd, {}

