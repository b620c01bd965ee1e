"""No orphans: Ctrl-C, SIGTERM and SIGKILL of the harness leave no rank process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from proctools import alive, rank_processes, wait_until

SUPPORT = str(Path(__file__).resolve().parents[1] / "support")


def start_hanging_run(tmp_path):
    """A real `syncbn-harness run` whose rank 1 sleeps: the harness waits in its pool."""
    marker = tmp_path / "rank1-sleeping"
    # TMPDIR: a SIGKILLed harness cannot remove multiprocessing's folder (pymp-*): let it be the test's.
    env = dict(os.environ, PYTHONPATH=SUPPORT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               SYNCBN_PROBE_MARKER=str(marker), TMPDIR=str(tmp_path))
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "run", "--impl", "probes:SleepOnRank1", "--case",
         "allgather-shape/uneven-2-6/float32-float32/contiguous/ws2", "--timeout", "600",
         "--store", str(tmp_path / "store")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        # Started with SIGINT ignored, as a shell's background job is (and as an xdist worker may pass on):
        # the harness must still take Ctrl-C.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert wait_until(lambda: len(rank_processes(proc.pid)) == 2, timeout=120), "ranks did not start"
    ranks = rank_processes(proc.pid)
    # The case is under way once rank 1 sleeps in forward (rank 0 then waits in the all_gather); on a busy
    # machine that can take many seconds after the processes exist.
    assert wait_until(marker.exists, timeout=120), "rank 1 never reached forward"
    time.sleep(0.5)
    return proc, ranks


@pytest.mark.slow
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_interrupt_reaps_every_rank(tmp_path, how):
    proc, ranks = start_hanging_run(tmp_path)
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)  # a terminal sends SIGINT to the whole foreground group
    else:
        proc.send_signal(signal.SIGTERM)
    try:
        # communicate() drains both pipes while waiting: a harness blocked writing to a full pipe is not stuck.
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)  # the harness writes its threads' stacks to stderr
        time.sleep(1)
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        pytest.fail("the harness did not end within 60 s of the signal; its stacks:\n" + err.decode()[-6000:])
    err = err.decode()
    code = proc.returncode
    assert code == 130, err
    assert ("interrupted" if how == "ctrl-c" else "terminated") + "; every rank process was stopped" in err
    # What was done is kept, and the way to go on is said.
    assert f"the results finished so far are stored in {tmp_path / 'store'}" in err
    assert "--resume" in err.split("to continue:")[1]
    assert wait_until(lambda: not any(alive(p) for p in ranks), timeout=5), "rank processes outlived the harness"


@pytest.mark.slow
def test_sigkill_of_the_harness_takes_the_ranks_down(tmp_path):
    proc, ranks = start_hanging_run(tmp_path)
    proc.kill()
    proc.wait(timeout=10)
    assert wait_until(lambda: not any(alive(p) for p in ranks), timeout=5), "ranks outlived a SIGKILLed harness"
