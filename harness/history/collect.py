"""A history run: the selection run in an environment per release, every record in one store, resumable.

For each release, oldest first (:func:`collect`):
1. a release the store's manifest already holds with the same selection is
   skipped (``stored``); ``--update`` runs it for the cases it lacks (the
   catalog grew), ``--rerun`` for every case again;
2. its environment is made by the bisection machinery
   (:func:`harness.bisect.envs.ensure_env`: a fresh virtual environment with
   that torch, this harness from its source tree and its dependencies, in the
   shared cache);
3. ``ENV_PYTHON -m harness run --resume --store STORE`` runs the selection
   there (``--resume`` keeps what an interrupted run of that release already
   stored; ``--rerun`` runs every case again, the new records superseding the
   old), its console output kept in ``STORE/logs/<release>.log``;
4. what it cost is measured (the environment's size on disk, counting each
   hard-linked file once) and the environment is removed unless kept.

The manifest, ``STORE/history.json``, says per release what happened:
``stored`` (with the build key, the record counts and the times), or
``failed`` with why (an install that failed, a run that exited other than 0
or 1). A release that fails is never dropped silently: the page shows it with
its reason. After each release the manifest is read again and rewritten
whole (to a temporary file, then renamed) under a file lock
(:func:`record_outcome`), so an interrupted history loses at most the release
in flight, two histories of other releases can share a store, and the store
itself is append-only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from packaging.version import Version

from harness.bisect import children
from harness.bisect.builds import Build, IndexOptions, InstallFailed
from harness.bisect.envs import EnvOptions, env_dir, ensure_env
from harness.bisect.verdicts import SCRUBBED_ENV
from harness.errors import UsageError
from harness.selection import Selection

MANIFEST = "history.json"
RUN_TIMEOUT_S = 3 * 3600.0  # one release's run of the selection


@dataclass
class ReleaseOutcome:
    """What the history did with one release."""

    release: str
    status: str  # stored, failed
    reason: str = ""
    build_key: Optional[str] = None
    torch_version: Optional[str] = None
    torch_git_version: Optional[str] = None
    counts: dict = field(default_factory=dict)  # status -> records (latest of each (impl, case))
    install_s: float = 0.0
    run_s: float = 0.0
    env_bytes: int = 0
    selection: list = field(default_factory=list)
    finished_at: str = ""

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def read_manifest(store: Path) -> dict[str, ReleaseOutcome]:
    """Release -> outcome, from ``STORE/history.json`` (empty when there is none)."""
    path = Path(store) / MANIFEST
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
        return {r: ReleaseOutcome(**d) for r, d in data["releases"].items()}
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{path} is not a history manifest ({exc}): move it aside, or give another --store; "
                         "the store's records are untouched") from None


def record_outcome(store: Path, outcome: ReleaseOutcome) -> dict[str, ReleaseOutcome]:
    """Set one release's outcome in the manifest and return them all: read, changed and rewritten whole
    (atomically, releases in version order) under a file lock, so two histories over one store (other
    releases each) keep each other's entries."""
    from filelock import FileLock

    path = Path(store) / MANIFEST
    with FileLock(str(path) + ".lock", timeout=60):
        outcomes = read_manifest(store)
        outcomes[outcome.release] = outcome
        ordered = {r: outcomes[r].to_dict() for r in sorted(outcomes, key=Version)}
        tmp = path.with_name(f"{MANIFEST}.tmp{os.getpid()}")
        tmp.write_text(json.dumps({"releases": ordered}, indent=1) + "\n")
        os.replace(tmp, path)
    return outcomes


def disk_bytes(directory: Path) -> int:
    """Bytes a folder takes on disk, each hard-linked file counted once."""
    seen, total = set(), 0
    for root, _dirs, files in os.walk(directory):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total


def release_records(store: Path, release: str) -> tuple[Optional[str], list]:
    """The build key in ``store`` that holds ``release`` (its public version) and its latest records."""
    from harness.results.store import Store
    from harness.results.where import Where

    s = Store(store)
    want = Version(release).public
    for key in s.builds():
        version = key.split("-", 1)[0]
        try:
            if Version(version).public == want:
                return key, list(s.latest(Where(build=key)))
        except ValueError:
            continue
    return None, []


def collect(releases: Sequence[str], store: Path, selection: Selection, *, keep_envs: bool = False,
            rerun: bool = False, update: bool = False, installer: str = "auto",
            index: Optional[IndexOptions] = None, log: Callable[[str], None] = print) -> dict[str, ReleaseOutcome]:
    """Run ``selection`` in each release's environment into ``store``; see the module docstring.

    ``rerun``: run stored releases again, every case; ``update``: run stored releases again for the cases
    they lack only (cases the catalog gained since)."""
    store = Path(store).absolute()
    (store / "logs").mkdir(parents=True, exist_ok=True)
    outcomes = read_manifest(store)
    argv = selection.argv()
    opts = EnvOptions(inherit=False, index=index or IndexOptions(), installer=installer)
    for n, release in enumerate(releases, 1):
        label = f"[{n}/{len(releases)}] torch=={release}"
        held = outcomes.get(release)
        if held and held.status == "stored" and held.selection == argv and not (rerun or update):
            log(f"{label}: stored already ({_counts(held.counts)}); skipped (--update runs the cases it lacks, "
                "--rerun every case)")
            continue
        outcome = _one(release, store, selection, opts, keep_envs, resume=not rerun,
                       log=lambda s, _l=label: log(f"{_l}: {s}"))
        outcomes = record_outcome(store, outcome)
    return outcomes


def _one(release: str, store: Path, selection: Selection, opts: EnvOptions, keep_envs: bool, *, resume: bool,
         log: Callable[[str], None]) -> ReleaseOutcome:
    build = Build("release", f"torch=={release}", package="torch", version=release)
    out = ReleaseOutcome(release, "failed", selection=selection.argv())
    t0 = time.monotonic()
    log("making its environment")
    try:
        python, _created = ensure_env(build, opts, lambda s: log(s.strip()))
    except InstallFailed as exc:
        out.reason = f"install failed: {exc}"
        out.finished_at = children.now()
        log(out.reason)
        return out
    out.install_s = round(time.monotonic() - t0, 1)
    directory = env_dir(build, opts)
    out.env_bytes = disk_bytes(directory)
    log(f"environment ready in {out.install_s:.0f}s ({out.env_bytes / 2**30:.1f} GiB); running the selection")
    logfile = store / "logs" / f"{release}.log"
    cmd = [str(python), "-m", "harness", "run", *(["--resume"] if resume else []), "--store", str(store),
           *selection.argv()]
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
    t1 = time.monotonic()
    try:
        with open(logfile, "w") as f:
            f.write(f"$ {' '.join(cmd)}\n")
            f.flush()
            code = children.run_group(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        code = None
    out.run_s = round(time.monotonic() - t1, 1)
    key, records = release_records(store, release)
    out.build_key = key
    if records:
        out.torch_version, out.torch_git_version = records[0].torch_version, records[0].torch_git_version
    for r in records:
        out.counts[r.status.value] = out.counts.get(r.status.value, 0) + 1
    if code in (0, 1) and records:
        out.status, out.reason = "stored", ""
    elif code is None:
        out.reason = f"the run took more than {RUN_TIMEOUT_S:.0f}s (log: {logfile})"
    else:
        out.reason = (f"`run` exited {code} after {len(records)} records: "
                      f"{children.tail(logfile.read_text(errors='replace'), 2)} (log: {logfile})")
    out.finished_at = children.now()
    log(f"{out.status} in {out.run_s:.0f}s: {_counts(out.counts)}" + (f"; {out.reason}" if out.reason else ""))
    if not keep_envs:
        shutil.rmtree(directory, ignore_errors=True)
        for leftover in (".lock", ".install.log"):  # the install went well: nothing points to its log
            Path(str(directory) + leftover).unlink(missing_ok=True)
        log(f"environment removed ({out.env_bytes / 2**30:.1f} GiB freed)")
    return out


def _counts(counts: dict) -> str:
    total = sum(counts.values())
    return f"{total} records: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda t: -t[1]))
