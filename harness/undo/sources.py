"""SyncBatchNorm's Python files as a torch release shipped them, read from that release's smallest wheel.

Undoing an upstream change needs the file of the release before it and of the
first release with it. Every torch release since 1.0 is on PyPI, and its macOS
wheels are the small ones (tens of MB, against GBs for CUDA builds): only the
Python files are wanted, never run, so the platform does not matter.
:func:`release_file` downloads one wheel of the release with ``pip download``
(no dependencies, any CPython of :data:`PYTHONS`, any platform of
:data:`PLATFORMS`), keeps the files of :data:`FILES` under the cache
(``cache_folder("sources")/<release>/``, one entry per release, found there
next time) and deletes the wheel. A file the release lacks (``_functions.py``
before 1.1) reads as empty. ``folder`` (``--sources``) reads a folder
laid out the same way instead, for machines without an index.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path, PurePosixPath
from typing import Optional

from harness import paths
from harness.errors import HarnessError, UsageError

FILES = ("torch/nn/modules/_functions.py", "torch/nn/modules/batchnorm.py")
PYTHONS = ("3.11", "3.12", "3.10", "3.9", "3.8", "3.7")
PLATFORMS = ("macosx_14_0_arm64", "macosx_11_0_arm64", "macosx_10_9_x86_64", "macosx_10_7_x86_64")
DOWNLOAD_TIMEOUT_S = 900


def cached(release: str, folder: Optional[Path] = None) -> Path:
    """The folder holding ``release``'s files: ``folder/<release>`` or the cache's entry."""
    return (Path(folder) if folder else paths.cache_folder("sources")) / release


def release_file(release: str, rel: str, folder: Optional[Path] = None) -> str:
    """The text of ``rel`` (one of :data:`FILES`) as torch ``release`` shipped it."""
    if rel not in FILES:
        raise UsageError(f"{rel!r} is not a file this sweep reads: one of {', '.join(FILES)}")
    path = cached(release, folder) / rel
    if not path.is_file() and path.parents[len(PurePosixPath(rel).parts) - 1].is_dir():
        return ""  # the release is there without this file
    if not path.is_file():
        if folder:
            raise UsageError(f"--sources {folder}: no {release}/{rel} there; lay the folder out as "
                             f"<release>/{rel}, or leave --sources out to download the release's wheel")
        _download(release, cached(release))
    return path.read_text()


def _download(release: str, dest: Path) -> None:
    """Extract :data:`FILES` of one wheel of ``release`` into ``dest`` (written whole, or not at all)."""
    with tempfile.TemporaryDirectory(prefix="syncbn-sources-") as tmp:
        wheel = _fetch_wheel(release, Path(tmp))
        staging = Path(tmp) / "files"
        with zipfile.ZipFile(wheel) as zf:
            for rel in FILES:
                if rel in zf.namelist():
                    zf.extract(rel, staging)
        staging.mkdir(exist_ok=True)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not dest.exists():
            staging.rename(dest)


def _fetch_wheel(release: str, into: Path) -> Path:
    """``pip download`` one wheel of torch ``release`` for the first (python, platform) the index has."""
    tried = []
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    for python in PYTHONS:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", *platforms,
               "--python-version", python, "--implementation", "cp", "-d", str(into), f"torch=={release}"]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise HarnessError(f"pip download of torch {release} took over {DOWNLOAD_TIMEOUT_S} s") from None
        wheels = sorted(into.glob("torch-*.whl"))
        if done.returncode == 0 and wheels:
            return wheels[0]
        tried.append(python)
    raise HarnessError(f"no macOS wheel of torch {release} could be downloaded for CPython {', '.join(tried)}: is "
                       f"a package index reachable? Else pass --sources with the files laid out as "
                       f"<release>/{FILES[0]}")
