"""Child processes the harness supervises: each in a session of its own, stopped as a whole, always reaped.

A pip install, a ``run`` in another build, a GPU suite's step or a benchmarked
command may start children of its own (ranks, a forkserver, a compiler). So a
child starts in a new session, which makes it the leader of a new process
group, and stopping it means signalling that whole group: SIGTERM first when a
grace is given (a harness command reaps its ranks on SIGTERM), then SIGKILL,
and once more SIGKILL after the leader is gone, for what outlived it.

Protocol:
- every wait has a limit; a child past its limit is stopped (never left
  running) and the result says so (:attr:`Finished.timed_out`): a timeout is
  data, as an exit code is; the caller decides whether it is an error;
- every child is reaped, on its own exit, on a timeout and on an exception
  (Ctrl-C): :func:`run_group` stops and reaps the group before the
  exception goes on;
- the leader is reaped with ``wait4``, which gives its peak resident memory;
- output is captured into temporary files, not pipes, so a child that writes
  much never blocks on a pipe nobody reads, and one wait serves every case.

:func:`alive` and :func:`in_session` ask about processes by id: whether one is
still there, and which live processes a session still holds (Linux, ``/proc``).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import IO, Optional, Union

# SIGKILL after a group's leader was killed: how long to wait for the kernel to let it be reaped.
REAP_S = 10.0
Output = Union[str, bytes, None]


@dataclass(frozen=True)
class Finished:
    """How a supervised child ended.

    ``code`` is its exit code, or minus the signal that ended it (as :mod:`subprocess` says it); ``out`` and
    ``err`` are what it wrote when captured (``None`` where it wrote elsewhere); ``peak_mib`` is the leader's
    peak resident memory (its children not counted; Linux carries the starting process's size across the fork
    and exec, so it is never below this process's size then: measure from a small parent); ``pid`` was its
    process id, and so the id of the session it led (:func:`in_session` tells what of it still runs)."""

    pid: int
    code: int
    out: Output
    err: Output
    wall_s: float
    peak_mib: float
    timed_out: bool = False


class Group:
    """A started child in its own session (so the leader of its own process group), not yet waited for.

    ``stdout``/``stderr`` are files (or :data:`subprocess.STDOUT` for stderr) as :class:`subprocess.Popen`
    takes them; ``input`` (str, or bytes with ``text=False``) is what it reads on stdin (nothing otherwise).
    Raises :class:`OSError` when the program cannot be started."""

    def __init__(self, cmd: list[str], *, env: Optional[dict] = None, cwd=None, stdout: Optional[IO] = None,
                 stderr=None, input: Output = None, text: bool = True):
        if subprocess.PIPE in (stdout, stderr):
            raise ValueError("a pipe nobody reads can block the child: leave stdout/stderr None to capture them")
        self.cmd, self.text = list(cmd), text
        self._stdin = tempfile.TemporaryFile()
        if input is not None:
            self._stdin.write(input.encode() if isinstance(input, str) else input)
            self._stdin.seek(0)
        self._out = tempfile.TemporaryFile() if stdout is None else None
        self._err = tempfile.TemporaryFile() if stderr is None else None
        self.t0 = time.perf_counter()
        try:
            self.proc = subprocess.Popen(cmd, stdin=self._stdin, stdout=stdout or self._out,
                                         stderr=self._err or stderr, env=env, cwd=cwd, start_new_session=True)
        except BaseException:
            self._close()
            raise
        finally:
            self._stdin.close()  # the child has its own copy
        self.pid = self.proc.pid
        self.code: Optional[int] = None
        self.wall_s: Optional[float] = None
        self.peak_mib = 0.0
        self.timed_out = False

    def poll(self) -> Optional[int]:
        """The leader's exit code if it has ended (reaping it), else None; never blocks."""
        return self.wait(0)

    def wait(self, timeout: float) -> Optional[int]:
        """Wait at most ``timeout`` seconds for the leader to end; its exit code, or None if it is still running."""
        if self.code is not None:
            return self.code
        deadline = time.monotonic() + max(0.0, timeout)
        fd = _pidfd(self.pid)
        try:
            while True:
                pid, status, usage = os.wait4(self.pid, os.WNOHANG)
                if pid:
                    self._ended(status, usage)
                    return self.code
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                if fd is not None:
                    select.select([fd], [], [], left)
                else:
                    time.sleep(min(0.01, left))
        finally:
            if fd is not None:
                os.close(fd)

    def _ended(self, status: int, usage) -> None:
        self.wall_s = time.perf_counter() - self.t0
        self.code = os.waitstatus_to_exitcode(status)
        self.proc.returncode = self.code  # reaped here: Popen must not wait for it again
        self.peak_mib = usage.ru_maxrss / 1024

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the whole group (nothing if it is gone). Safe from another thread."""
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, term_grace: Optional[float] = None) -> None:
        """Stop the whole group and reap the leader: SIGTERM and ``term_grace`` seconds to end first when a grace
        is given, then SIGKILL; once the leader is reaped, SIGKILL again for what is left of its group."""
        if self.code is None and term_grace is not None:
            self.signal(signal.SIGTERM)
            self.wait(term_grace)
        if self.code is None:
            self.signal(signal.SIGKILL)
            if self.wait(REAP_S) is None:  # not seen in the kernel's time: the leader itself, once more
                self.proc.kill()
                self.wait(REAP_S)
        self.signal(signal.SIGKILL)  # a grandchild that outlived its parent, still in the group

    def finish(self, timeout: float, term_grace: Optional[float] = None) -> Finished:
        """Wait for the leader until ``timeout`` seconds after the start, stop the group past it (or on any
        exception, which then goes on), and return how it ended; the captured output is read and closed."""
        try:
            if self.wait(self.t0 + timeout - time.perf_counter()) is None:
                self.timed_out = True
                self.stop(term_grace)
        except BaseException:
            self.stop()
            self._close()
            raise
        out, err = self._read(self._out), self._read(self._err)
        self._close()
        wall = self.wall_s if self.wall_s is not None else time.perf_counter() - self.t0
        code = self.code if self.code is not None else -signal.SIGKILL
        return Finished(self.pid, code, out, err, wall, self.peak_mib, self.timed_out)

    def _read(self, f) -> Output:
        if f is None or f.closed:
            return None
        f.seek(0)
        data = f.read()
        return data.decode(errors="replace") if self.text else data

    def _close(self) -> None:
        for f in (self._stdin, self._out, self._err):
            if f is not None:
                f.close()


def run_group(cmd: list[str], *, timeout: float, term_grace: Optional[float] = None, env: Optional[dict] = None,
              cwd=None, stdout: Optional[IO] = None, stderr=None, input: Output = None,
              text: bool = True) -> Finished:
    """Run ``cmd`` in a session of its own to its end or for at most ``timeout`` seconds, then stop its group
    (SIGTERM and ``term_grace`` seconds first when given, then SIGKILL); how it ended.

    Output is captured (``Finished.out``, ``.err``) unless ``stdout``/``stderr`` send it elsewhere. On an
    exception (Ctrl-C) the group is killed and reaped before the exception goes on. :class:`OSError` when the
    program cannot be started."""
    return Group(cmd, env=env, cwd=cwd, stdout=stdout, stderr=stderr, input=input, text=text).finish(
        timeout, term_grace)


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a zombie not yet reaped counts; another user's process counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def in_session(sid: int) -> list[int]:
    """Pids of the live (not zombie) processes whose session is ``sid``. Linux only (``/proc``); empty elsewhere."""
    pids = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:
            pids.append(int(entry))
    return pids


def _pidfd(pid: int) -> Optional[int]:
    """A file descriptor that becomes readable when ``pid`` ends (Linux 5.3+), or None where there is none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None
