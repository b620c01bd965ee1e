"""Scripts for ``git bisect run``: build the checkout, then ``check``, with exit codes git understands.

The written script is standalone Python (standard library only) whose shebang
is this interpreter, so the build step and ``check`` use the environment the
script was written from. At each commit ``git bisect run`` calls it in the
checkout; it

1. runs the build command (``python setup.py develop``, ``pip install -e .``)
   in the checkout's top folder, with this interpreter's ``bin`` first on
   ``PATH``: a failed or timed-out build exits 125 (skip the commit);
2. runs ``PYTHON -m harness check <selection>`` outside the checkout (so the
   source tree never shadows what the build installed), optionally with the
   checkout first on ``PYTHONPATH`` (an implementation module that is not
   installed); 0 good, 1..127 bad as ``check`` said, 125 untestable, and
   anything 128 or more (a signal, an abort) becomes 125;
3. appends one line per step to the log next to the script: time, commit,
   step, command, exit code, seconds.

Every child runs in its own process group with a time limit; on a timeout the
whole group is killed and reaped. Ctrl-C or SIGTERM of the script kills the
step in flight and exits 130, which stops ``git bisect run`` on purpose.
"""

from __future__ import annotations

import datetime
import os
import shlex
import stat
import sys
from pathlib import Path
from typing import Optional

from harness.selection import Selection
from harness.errors import UsageError

BUILD_TIMEOUT_S = 4 * 3600.0  # a full PyTorch build on a small machine takes hours
CHECK_TIMEOUT_S = 3600.0

TEMPLATE = r'''#!{python}
"""`git bisect run` step written by syncbn-harness {version} on {written_at}.

    {command}

Build: {build_cmd_doc}
Check: {check_doc}
Exit: 0 good, 1 bad (check's verdict), 125 skip (build failed, check untestable, timed out,
or check ended with a code of 128 or more). Log: {log}
"""
import datetime
import os
import signal
import subprocess
import sys
import tempfile
import time

PYTHON = {python!r}
BUILD_CMD = {build_cmd!r}
CHECK_ARGS = {check_args!r}
CHECKOUT_ON_PATH = {checkout_on_path!r}
BUILD_TIMEOUT = {build_timeout!r}
CHECK_TIMEOUT = {check_timeout!r}
LOG = os.path.join(os.path.dirname(os.path.abspath(__file__)), {log_name!r})
UNTESTABLE = 125  # harness.errors.EXIT_UNTESTABLE, spelled out: this file runs without the harness
_child = None


def log(commit, step, cmd, code, seconds):
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    line = "%s commit=%s step=%s exit=%s time=%.1fs cmd=%s" % (stamp, commit, step, code, seconds, cmd)
    with open(LOG, "a") as f:
        f.write(line + "\n")
    print("bisect-script: " + line, file=sys.stderr, flush=True)


def git(*args):
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def run(cmd, cwd, env, timeout, shell=False):
    """Exit code of cmd in its own process group; None on timeout (the group is killed and reaped)."""
    global _child
    _child = subprocess.Popen(cmd, cwd=cwd, env=env, shell=shell, start_new_session=True)
    try:
        return _child.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_child()
        return None
    finally:
        _child = None


def kill_child():
    if _child is not None and _child.poll() is None:
        try:
            os.killpg(_child.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            _child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass


def on_signal(signum, frame):
    kill_child()
    log(COMMIT, "interrupted", "signal %d" % signum, 130, 0.0)
    os._exit(130)


def main():
    top = git("rev-parse", "--show-toplevel") or os.getcwd()
    env = dict(os.environ)
    bindir = os.path.dirname(PYTHON)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    if os.path.exists(os.path.join(os.path.dirname(bindir), "pyvenv.cfg")):
        env["VIRTUAL_ENV"] = os.path.dirname(bindir)
    if CHECKOUT_ON_PATH:
        env["PYTHONPATH"] = top + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if BUILD_CMD:
        t0 = time.monotonic()
        code = run(BUILD_CMD, top, env, BUILD_TIMEOUT, shell=True)
        log(COMMIT, "build", BUILD_CMD, "timeout" if code is None else code, time.monotonic() - t0)
        if code != 0:
            log(COMMIT, "verdict", "skip: the build failed", UNTESTABLE, 0.0)
            return UNTESTABLE
    # Not inside the checkout: `python -m` puts the working folder first on sys.path.
    here = os.path.dirname(LOG)
    inside = os.path.realpath(here) + os.sep
    cwd = tempfile.gettempdir() if inside.startswith(os.path.realpath(top) + os.sep) else here
    cmd = [PYTHON, "-m", "harness", "check", *CHECK_ARGS]
    t0 = time.monotonic()
    code = run(cmd, cwd, env, CHECK_TIMEOUT)
    log(COMMIT, "check", " ".join(cmd), "timeout" if code is None else code, time.monotonic() - t0)
    if code is None or code < 0 or code >= 128:
        log(COMMIT, "verdict", "skip: check timed out or ended with a signal or a code >= 128", UNTESTABLE, 0.0)
        return UNTESTABLE
    log(COMMIT, "verdict", {{0: "good", UNTESTABLE: "skip"}}.get(code, "bad"), code, 0.0)
    return code


if __name__ == "__main__":
    COMMIT = git("rev-parse", "--short=12", "HEAD") or "unknown"
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    sys.exit(main())
'''


def write_script(output: str, sel: Selection, *, build_cmd: Optional[str] = None,
                 checkout_on_path: bool = False, python: Optional[str] = None,
                 build_timeout: float = BUILD_TIMEOUT_S, check_timeout: float = CHECK_TIMEOUT_S,
                 command: str = "") -> Path:
    """Write the ``git bisect run`` script to ``output`` (mode 755); return its path. The log is ``output.log``."""
    from harness import __version__

    path = Path(output).expanduser().absolute()
    if path.is_dir():
        raise UsageError(f"-o {output!r} is a folder: give a file name, e.g. {Path(output) / 'bisect-step.py'}")
    if not path.parent.is_dir():
        raise UsageError(f"-o {output!r}: folder {path.parent} does not exist; create it first")
    python = python or sys.executable
    if not os.path.isabs(python):
        raise UsageError(f"interpreter {python!r} must be an absolute path")
    check_args = sel.argv()
    text = TEMPLATE.format(
        python=python, version=__version__,
        written_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        command=command or "syncbn-harness bisect-script " + shlex.join(check_args),
        build_cmd_doc=build_cmd or "none", check_doc=f"{python} -m harness check {shlex.join(check_args)}",
        log=path.name + ".log", build_cmd=build_cmd or None, check_args=check_args,
        checkout_on_path=checkout_on_path, build_timeout=build_timeout, check_timeout=check_timeout,
        log_name=path.name + ".log")
    compile(text, str(path), "exec")  # a template bug must fail here, not at the first commit
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path
