"""harness.procs: real children (and grandchildren), their exit codes, output, limits, memory and sessions."""

from __future__ import annotations

import resource
import signal
import sys
import time

import pytest

from harness.procs import Group, alive, in_session, run_group

PY = sys.executable


def gone_within(pids, seconds=10.0) -> bool:
    """Whether every pid has left (a killed orphan is reaped by whoever adopted it, a moment later)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(_live(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def _live(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_exit_codes_and_output_are_returned():
    got = run_group([PY, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(7)"], timeout=60)
    assert (got.code, got.out.strip(), got.err.strip(), got.timed_out) == (7, "out", "err", False)
    assert 0 < got.wall_s < 60
    assert run_group([PY, "-c", "pass"], timeout=60).code == 0


def test_a_child_ended_by_a_signal_reports_minus_the_signal():
    got = run_group([PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"], timeout=60)
    assert got.code == -signal.SIGTERM and not got.timed_out


def test_a_timeout_kills_the_whole_group_grandchild_included(tmp_path):
    pidfile = tmp_path / "grandchild"
    script = ("import subprocess, sys, time\n"
              f"p = subprocess.Popen([{PY!r}, '-c', 'import time; time.sleep(300)'])\n"
              f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
              "print('started', flush=True)\n"
              "time.sleep(300)\n")
    t0 = time.monotonic()
    got = run_group([PY, "-c", script], timeout=3)
    assert got.timed_out and got.code == -signal.SIGKILL
    assert time.monotonic() - t0 < 30
    assert got.out.strip() == "started"  # what it wrote before the limit is kept
    grandchild = int(pidfile.read_text())
    assert gone_within([grandchild]), f"grandchild {grandchild} outlived the timeout"


def test_term_grace_lets_the_child_end_itself_first():
    script = ("import signal, sys, time\n"
              "def bye(*_):\n    print('cleaned up', flush=True); sys.exit(0)\n"
              "signal.signal(signal.SIGTERM, bye)\n"
              "print('ready', flush=True)\n"
              "time.sleep(300)\n")
    got = run_group([PY, "-c", script], timeout=3, term_grace=20)
    assert got.timed_out and got.code == 0
    assert got.out.split() == ["ready", "cleaned", "up"]
    # Without a grace the same child gets SIGKILL and never cleans up.
    got = run_group([PY, "-c", script], timeout=3)
    assert got.timed_out and got.code == -signal.SIGKILL and "cleaned" not in got.out


def test_peak_memory_is_the_childs():
    """The leader's peak resident memory, in MiB. Linux keeps a peak across exec, so a child forked from a large
    parent (this test process, torch imported) may report the parent's size: the bound allows for it."""
    parent = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    big = run_group([PY, "-c", "b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096])"], timeout=60)
    assert big.code == 0
    assert 300 <= big.peak_mib <= max(parent, 300) + 200, (big.peak_mib, parent)


def test_output_to_a_file_and_input_from_a_string(tmp_path):
    log = tmp_path / "log"
    with open(log, "w") as f:
        got = run_group([PY, "-c", "import sys; print(sys.stdin.read().upper()); sys.exit(sys.stdin.closed)"],
                        timeout=60, stdout=f, stderr=f, input="hello")
    assert got.code == 0 and got.out is None and got.err is None
    assert log.read_text().strip() == "HELLO"
    raw = run_group([PY, "-c", "import sys; sys.stdout.buffer.write(sys.stdin.buffer.read()[::-1])"], timeout=60,
                    input=b"\x00\x01\x02", text=False)
    assert raw.out == b"\x02\x01\x00"


def test_a_program_that_cannot_start_raises_oserror(tmp_path):
    with pytest.raises(OSError):
        run_group([str(tmp_path / "no-such-program")], timeout=5)


def test_group_poll_wait_and_session():
    g = Group([PY, "-c", "import time; time.sleep(300)"])
    try:
        assert g.poll() is None and g.wait(0.2) is None
        assert alive(g.pid) and in_session(g.pid) == [g.pid]  # its own session, led by it
    finally:
        g.stop()
    assert g.code == -signal.SIGKILL and not alive(g.pid)  # reaped: not even a zombie is left
    assert in_session(g.pid) == []


def test_an_exception_while_waiting_kills_and_reaps_the_group():
    g = Group([PY, "-c", "import time; time.sleep(300)"])

    class Interrupted(Exception):
        pass

    def interrupt(*_):
        raise Interrupted

    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        with pytest.raises(Interrupted):
            g.finish(timeout=120)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert g.code == -signal.SIGKILL and not alive(g.pid)
