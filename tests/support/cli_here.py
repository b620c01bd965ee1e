"""A harness command run in the test's own process, as ``python -m harness ARGS`` would run it in a new one.

A command in a subprocess pays a Python start, an import of torch (about 3 CPU-seconds on two cores) and,
once it runs cases, a forkserver of its own that imports torch again. Run here, it uses the test process's
torch and the harness's forkserver of that process (started once per xdist worker). The ranks are real
processes all the same, forked from that forkserver; a pool hands them the environment it was started
with (its parent's, set here for the call), so what a plugin reads from the environment reaches them.

Use it where the property is the command's: exit code, output, files, records. Where it is the process's
(signals, the entry point's exit path, a terminal, ``check``'s mapping of exit codes for ``git bisect``),
run ``python -m harness`` in a subprocess.

For the call only: ``env`` is the whole environment; its ``PYTHONPATH`` entries go first on ``sys.path``,
as a new interpreter puts them, and modules imported from them are forgotten afterwards (a later test may
write another module of the same name); ``cwd`` is the current directory. The result reads like a
``subprocess.CompletedProcess``: ``returncode``, ``stdout``, ``stderr`` (text).
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from subprocess import CompletedProcess
from typing import Mapping, Optional, Sequence


def run_here(args: Sequence[str], *, env: Optional[Mapping[str, str]] = None,
             cwd: Optional[os.PathLike] = None) -> CompletedProcess:
    """``syncbn-harness ARGS`` in this process (see the module docstring)."""
    from harness.commands import dispatch

    args = [str(a) for a in args]
    if args and args[0] == "check":
        raise ValueError("check maps exit codes in its entry point (harness.__main__): run it in a subprocess")
    env = dict(os.environ if env is None else env)
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    saved_env, saved_path, saved_cwd, before = dict(os.environ), list(sys.path), os.getcwd(), set(sys.modules)
    out, err = io.StringIO(), io.StringIO()
    code = 0
    try:
        os.environ.clear()
        os.environ.update(env)
        sys.path[:0] = [p for p in extra if p not in sys.path]
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                dispatch(args)
            except SystemExit as exc:
                if exc.code is None or isinstance(exc.code, int):
                    code = exc.code or 0
                else:  # as the interpreter does with a message
                    print(exc.code, file=sys.stderr)
                    code = 1
    finally:
        os.chdir(saved_cwd)
        sys.path[:] = saved_path
        os.environ.clear()
        os.environ.update(saved_env)
        for name in set(sys.modules) - before:
            origin = getattr(sys.modules[name], "__file__", None) or ""
            if any(origin.startswith(os.path.join(p, "")) for p in extra):
                del sys.modules[name]
    return CompletedProcess(["syncbn-harness", *args], code, out.getvalue(), err.getvalue())
