"""Errors a user can fix.

Protocol: library code raises a subclass of :class:`HarnessError` for anything
the user can act on (a bad option, a missing compiler, an unwritable store),
with a message that names the value and the fix. The CLI catches
``HarnessError`` once, prints the message and exits with the error's
``exit_code``. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

# The exit codes of every command, named once. 0 is success; 1 is what a command looks for (an unexpected
# failure, a new finding, a bad build), decided by each command.
EXIT_FOUND = 1
EXIT_USAGE = 2  # a bad option, an unknown case or implementation
EXIT_HARNESS = 3  # the harness could not do its work (a kernel build, a store, no rank could start)
EXIT_UNTESTABLE = 125  # `git bisect run`'s "this commit cannot be tested": check's answer when it cannot judge
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
EXIT_PARENT_GONE = 70  # a rank process whose harness died (EX_SOFTWARE): it leaves at once, nothing to report to


class HarnessError(Exception):
    """Base of every error a user can fix; ``exit_code`` is what ``run`` exits with."""

    exit_code = EXIT_HARNESS


class UsageError(HarnessError):
    """Unknown case or implementation, bad option value (exit 2)."""

    exit_code = EXIT_USAGE


class KernelBuildError(HarnessError):
    """The reference extension could not be built or loaded (no compiler, compile error)."""

    exit_code = EXIT_HARNESS


class ImplUnavailable(HarnessError):
    """An implementation cannot be used here (not installed, fails to import)."""

    exit_code = EXIT_HARNESS


class PluginUnavailable(ImplUnavailable):
    """A plugin the user named (``MODULE:ATTR``) does not import: the name given is wrong, like an unknown
    implementation's (exit 2)."""

    exit_code = EXIT_USAGE


class Terminated(BaseException):
    """SIGTERM arrived (a timeout wrapper, a CI job being cancelled).

    Raised by the CLI's SIGTERM handler so that the process unwinds like
    Ctrl-C: every pool's cleanup reaps its ranks. Not a :class:`HarnessError`
    (and not an ``Exception``): nothing may catch it by accident.
    """

    def __init__(self, signum: int = 15):
        super().__init__(f"terminated by signal {signum}")
        self.signum = signum
