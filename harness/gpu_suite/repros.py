"""Standalone repro files run side by side, each judged by the line it prints, not by its exit status alone.

A repro file (``docs/findings/*.py``, or one written by ``syncbn-harness
repro``) ends with one line that says what it saw, and exits with the
matching status:

- ``SYMPTOM SHOWS (...)`` and exit 1: the defect shows here;
- ``no symptom (...)`` and exit 0: it does not (fixed in this build, or absent);
- ``OTHER: ...`` and exit 2: it could not check (needs a GPU, a second rank, ...).

Any other ending (an uncaught exception, which also exits 1; a signal; the
time limit) is ``broken``: the file itself failed, and its verdict says
nothing about the defect. A file that imports a module this machine lacks
(the library it is about) is ``not run``, naming the module, before it starts.

``python -m harness.gpu_suite.repros --out FILE.json --logs DIR [--apex-path P] FILE...``
writes the verdicts to ``--out`` as each file ends (a step stopped at its
limit keeps what it saw) and each file's output to ``DIR/<stem>.txt``; it
exits 0 unless a file is ``broken``.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from harness import procs

SHOWS, ABSENT, CANNOT, NOT_RUN, BROKEN = "shows", "does not show", "could not run", "not run", "broken"
LINES = {SHOWS: ("SYMPTOM SHOWS", 1), ABSENT: ("no symptom", 0), CANNOT: ("OTHER", 2)}
PARALLEL = 3  # files at once: each spawns two to four ranks, beside the suite's other steps
TIMEOUT_S = 120
_running: set[procs.Group] = set()  # the files now running (each leads its own process group)
_running_lock = threading.Lock()
# CPython 3.11's ast.parse is not safe from several threads at once (gh-106905: "AST constructor recursion depth
# mismatch", seen here when run_all's threads parsed their files together).
_parse_lock = threading.Lock()


@dataclass
class Verdict:
    """What one repro file did."""

    file: str
    verdict: str  # shows | does not show | could not run | not run | broken
    exit: Optional[int]
    seconds: float
    line: str  # the verdict line it printed, or why it is broken / not run
    tail: list
    sha256: str = ""  # of the file as it ran: a claim about the file names its bytes (docs/findings/runs.toml)


def judge(exit_code: Optional[int], output: str) -> tuple[str, str]:
    """The verdict of a file that exited with ``exit_code`` after printing ``output`` (pure), and its line."""
    lines = [x.strip() for x in output.splitlines() if x.strip()]
    for verdict, (prefix, code) in LINES.items():
        said = [x for x in lines if x.startswith(prefix)]
        if said and exit_code == code:
            return verdict, said[-1]
    if exit_code is None:
        return BROKEN, "stopped at its time limit"
    if exit_code < 0:
        return BROKEN, f"killed by {signal.Signals(-exit_code).name}"
    last = lines[-1] if lines else "no output"
    return BROKEN, f"exit {exit_code} without a verdict line; last line: {last[:300]}"


def imported_modules(path: Path) -> list[str]:
    """The top-level modules ``path`` imports that are neither the standard library's nor torch."""
    with _parse_lock:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return sorted(n for n in names if n not in sys.stdlib_module_names and n not in ("torch", "__future__"))


def missing_modules(modules: list[str], env: dict) -> list[str]:
    """Which of ``modules`` the interpreter cannot find with ``env`` (checked in a child, as the file runs)."""
    if not modules:
        return []
    code = "import importlib.util, sys; print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))"
    proc = subprocess.run([sys.executable, "-c", code, *modules], env=env, capture_output=True, text=True,
                          timeout=60)
    return proc.stdout.split()


def run_one(path: Path, env: dict, log: Path, timeout_s: float = TIMEOUT_S) -> Verdict:
    """Run one file in its own process group (killed whole past ``timeout_s``); its verdict."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    missing = missing_modules(imported_modules(path), env)
    if missing:
        return Verdict(path.name, NOT_RUN, None, 0.0, f"needs {', '.join(missing)}, not installed here", [], digest)
    t0 = time.monotonic()
    with open(log, "w", encoding="utf-8") as out:
        group = procs.Group([sys.executable, str(path)], stdout=out, stderr=subprocess.STDOUT, env=env)
        with _running_lock:
            _running.add(group)
        try:
            code = group.wait(timeout_s)  # None: past its limit
        finally:
            group.stop()  # its ranks too, whatever they were doing; reaped
            with _running_lock:
                _running.discard(group)
    text = log.read_text(encoding="utf-8", errors="replace")
    verdict, line = judge(code, text)
    tail = [x for x in text.splitlines() if x.strip()][-4:]
    return Verdict(path.name, verdict, code, round(time.monotonic() - t0, 1), line, tail, digest)


def stop_all() -> None:
    """Kill every file's process group still running (the files run in sessions of their own, which a signal to
    this process's group does not reach)."""
    with _running_lock:
        for group in list(_running):
            group.signal(signal.SIGKILL)


def run_all(paths: list[Path], logs: Path, env: dict, parallel: int = PARALLEL, timeout_s: float = TIMEOUT_S,
            out: Optional[Path] = None) -> list[Verdict]:
    """Every file's verdict, in the order given (``parallel`` files at a time); with ``out``, the verdicts so far
    are rewritten there as each file ends, so that a step stopped at its limit keeps what it saw."""
    logs.mkdir(parents=True, exist_ok=True)
    done: dict[int, Verdict] = {}
    lock = threading.Lock()

    def one(i: int, p: Path) -> Verdict:
        v = run_one(p, env, logs / f"{p.stem}.txt", timeout_s)
        with lock:
            done[i] = v
            if out is not None:
                out.write_text(json.dumps([asdict(done[k]) for k in sorted(done)], indent=2), encoding="utf-8")
        return v

    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        return list(pool.map(lambda ip: one(*ip), enumerate(paths)))


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--logs", type=Path, required=True)
    parser.add_argument("--apex-path", default=None, help="PYTHONPATH entries that make apex importable")
    parser.add_argument("--parallel", type=int, default=PARALLEL)
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S)
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args(argv)
    env = dict(os.environ)
    if args.apex_path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (args.apex_path, env.get("PYTHONPATH")) if p)
    def stop(signum, frame):
        stop_all()  # first: the worker threads wait on these, and the pool waits on its threads
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        verdicts = run_all(args.files, args.logs, env, args.parallel, args.timeout, out=args.out)
    except KeyboardInterrupt:
        stop_all()
        return 130
    for v in verdicts:
        print(f"{v.file}: {v.verdict} (exit {v.exit}, {v.seconds:.0f}s): {v.line}", flush=True)
    return 1 if any(v.verdict == BROKEN for v in verdicts) else 0


if __name__ == "__main__":
    sys.exit(main())
