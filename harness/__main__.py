"""Console entry point: ``syncbn-harness`` and ``python -m harness``.

It imports the CLI lazily so that ``check`` can keep its exit-code contract
(0, 1, 125) even when the harness cannot be imported or its arguments do not
parse: git reads 2 as "bad" and 128 or more as "abort the bisect".
"""

from __future__ import annotations

import atexit
import os
import sys

from harness.errors import (  # a module of plain constants and classes: it imports nothing
    EXIT_FOUND, EXIT_INTERRUPTED, EXIT_UNTESTABLE, EXIT_USAGE)


def main(argv=None) -> None:
    """Run the CLI, then exit without the interpreter's teardown (see :func:`exit_now`)."""
    try:
        run(argv)
    except SystemExit as exc:
        exit_now(exc.code)
    exit_now(0)


def exit_now(code) -> None:
    """Exit with ``code`` (as ``sys.exit`` reads it) once atexit handlers have run and stdio is flushed.

    With torch loaded, the interpreter's own teardown (module globals, C++ destructors) takes 0.5 s or
    more after everything the harness does is finished: a one-case ``check`` in a ``git bisect run``
    loop pays it at every step. Every file the harness writes is closed (and the store fsynced) when its
    command returns, so nothing is lost by skipping it.
    """
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    if "torch" not in sys.modules:
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def run(argv=None) -> None:
    """Run the CLI; for ``check``, map every exit but 0, 1, 125 and Ctrl-C's 130 to 125."""
    args = list(sys.argv[1:] if argv is None else argv)
    is_check = bool(args) and args[0] == "check"
    try:
        from harness.commands import main as cli_main

        cli_main(args)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if is_check and code not in (0, EXIT_FOUND, EXIT_UNTESTABLE, EXIT_INTERRUPTED):
            why = ("the command line above is not valid" if code == EXIT_USAGE else f"the harness exited {code}")
            print(f"check: {why}; exiting 125 (cannot test) so that git bisect skips this commit instead of "
                  "marking it bad", file=sys.stderr)
            sys.exit(EXIT_UNTESTABLE)
        raise
    except BaseException as exc:  # noqa: BLE001 - only for check: nothing may escape as an abort
        if not is_check or isinstance(exc, KeyboardInterrupt):
            raise
        import traceback

        traceback.print_exc()
        print(f"check: the harness failed ({type(exc).__name__}: {exc}); cannot test", file=sys.stderr)
        sys.exit(EXIT_UNTESTABLE)


if __name__ == "__main__":
    main()
