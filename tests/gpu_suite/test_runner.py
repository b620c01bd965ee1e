"""Running the suite's steps: outcomes, limits, early steps, a required failure, and stopping cleanly.

Design: real child processes (``sh`` and Python), real process groups and real signals; no GPU is needed
to check how steps are run, stopped and recorded, since a step is only a command.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from harness.gpu_suite.runner import Outcome, run_steps
from harness.gpu_suite.steps import REPORT_RESERVE_S, Step

PASSED, FAILED, TIMED_OUT, NOT_RUN = Outcome.PASSED, Outcome.FAILED, Outcome.TIMED_OUT, Outcome.NOT_RUN


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for a reaper does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def sh(name, script, limit=20, **kw):
    return Step(name, ("sh", "-c", script), name.replace(" ", "-") + ".txt", limit, **kw)


def test_each_outcome_is_recorded_and_the_report_still_runs(tmp_path):
    steps = [sh("early", "sleep 1; echo built", early=True),
             sh("json", "echo '{\"a\": 1}'; echo noise >&2", stdout="x.json"),
             sh("slow", "sleep 60", limit=2),
             sh("bad", "exit 3"),
             sh("verdict", "exit 1", ok_exits=(0, 1)),
             sh("report", "echo report", closing=True)]
    lines = []
    t0 = time.monotonic()
    out = run_steps(steps, tmp_path, dict(os.environ), 300, header={"gpus": []}, echo=lines.append)
    assert time.monotonic() - t0 < 30
    got = {o.step: o.outcome for o in out}
    assert got == {"early": PASSED, "json": PASSED, "slow": TIMED_OUT, "bad": FAILED, "verdict": PASSED,
                   "report": PASSED}
    assert json.loads((tmp_path / "x.json").read_text()) == {"a": 1}  # stdout alone; stderr went to the log
    assert "noise" in (tmp_path / "logs" / "json.txt").read_text()
    assert "stopped at its limit" in (tmp_path / "logs" / "slow.txt").read_text()
    assert (tmp_path / "logs" / "early.txt").read_text() == "built\n"
    recorded = json.loads((tmp_path / "steps.json").read_text())
    assert [s["step"] for s in recorded["steps"]] == [s.name for s in steps] and recorded["gpus"] == []
    assert any("slow: timed out" in line for line in lines)


def test_a_required_failure_stops_all_but_the_report(tmp_path):
    steps = [sh("build", "exit 2", required=True), sh("tests", "echo never"), sh("report", "true", closing=True)]
    out = run_steps(steps, tmp_path, dict(os.environ), 300, header={}, echo=lambda _: None)
    assert [(o.step, o.outcome) for o in out] == [("build", FAILED), ("tests", NOT_RUN), ("report", PASSED)]
    assert not (tmp_path / "logs" / "tests.txt").exists()


def test_a_spent_budget_leaves_steps_not_run_but_the_report(tmp_path):
    steps = [sh("first", "sleep 60", limit=100), sh("second", "true"), sh("report", "true", closing=True)]
    budget = REPORT_RESERVE_S + 13  # the first step gets 3 s, the second nothing
    out = run_steps(steps, tmp_path, dict(os.environ), budget, header={}, echo=lambda _: None)
    assert [(o.step, o.outcome) for o in out] == [("first", TIMED_OUT), ("second", NOT_RUN), ("report", PASSED)]


def test_sigterm_to_the_suite_stops_the_step_and_its_children(tmp_path):
    """The step's whole process group goes (a grandchild too), and steps.json says what ran before."""
    pidfile = tmp_path / "pid"
    code = textwrap.dedent(f"""
        import os, signal, sys
        from pathlib import Path
        from harness.gpu_suite.runner import run_steps
        from harness.gpu_suite.steps import Step
        def stop(signum, frame):
            raise KeyboardInterrupt
        signal.signal(signal.SIGTERM, stop)
        steps = [Step("ok", ("true",), "ok.txt", 10),
                 Step("hang", ("sh", "-c", "sleep 300 & echo $! > {pidfile}; wait"), "hang.txt", 300)]
        try:
            run_steps(steps, Path({str(tmp_path)!r}), dict(os.environ), 600, header={{}}, echo=print)
        except KeyboardInterrupt:
            sys.exit(130)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(300):
            if pidfile.exists() and pidfile.read_text().strip():
                break
            time.sleep(0.1)
        grandchild = int(pidfile.read_text())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 130, proc.stderr.read()
    finally:
        proc.kill()
    for _ in range(50):
        if not alive(grandchild):
            break
        time.sleep(0.1)
    assert not alive(grandchild), "the step's child outlived the suite"
    assert [s["step"] for s in json.loads((tmp_path / "steps.json").read_text())["steps"]] == ["ok"]


def test_a_wave_runs_side_by_side_and_the_next_waits_for_it(tmp_path):
    """Three 2 s steps in one wave take about 2 s, not 6; the next wave starts only once all three ended."""
    stamp = tmp_path / "stamps"
    steps = [sh("a", f"sleep 2; date +%s.%N >> {stamp}"),
             sh("b", f"sleep 2; date +%s.%N >> {stamp}", with_previous=True),
             sh("c", f"sleep 2; date +%s.%N >> {stamp}", with_previous=True),
             sh("d", f"date +%s.%N >> {stamp}")]
    t0 = time.monotonic()
    out = run_steps(steps, tmp_path, dict(os.environ), 300, header={}, echo=lambda _: None)
    assert time.monotonic() - t0 < 5.5
    assert [o.outcome for o in out] == [PASSED] * 4 and [o.step for o in out] == ["a", "b", "c", "d"]
    times = [float(x) for x in stamp.read_text().split()]
    assert times[-1] >= max(times[:3])  # d wrote last: after the whole wave


def test_a_step_starts_with_another_and_is_joined_at_its_turn(tmp_path):
    steps = [sh("first", "sleep 1"), sh("trigger", "sleep 2"), sh("between", "sleep 1"),
             sh("companion", "sleep 2; echo done", starts_with="trigger")]
    t0 = time.monotonic()
    out = run_steps(steps, tmp_path, dict(os.environ), 300, header={}, echo=lambda _: None)
    assert time.monotonic() - t0 < 5.5  # 1 + 2 + 1, the companion's 2 s hidden under trigger and between
    assert [(o.step, o.outcome) for o in out] == [("first", PASSED), ("trigger", PASSED), ("between", PASSED),
                                                  ("companion", PASSED)]
    assert (tmp_path / "logs" / "companion.txt").read_text() == "done\n"


def test_an_exclusive_step_waits_for_the_early_ones(tmp_path):
    """A benchmark never shares the machine with a build still running from the start."""
    stamp = tmp_path / "stamps"
    steps = [sh("quick", "true"), sh("build", f"sleep 2; echo build $(date +%s.%N) >> {stamp}", early=True),
             sh("bench", f"echo bench $(date +%s.%N) >> {stamp}", exclusive=True)]
    out = run_steps(steps, tmp_path, dict(os.environ), 300, header={}, echo=lambda _: None)
    assert [o.outcome for o in out] == [PASSED] * 3
    seen = dict(line.split() for line in stamp.read_text().splitlines())
    assert float(seen["bench"]) >= float(seen["build"])


def test_an_exclusive_step_does_not_wait_for_cpu_work_started_with_another(tmp_path):
    """CPU work planned to overlap (the cpu-emulation) runs on beside the benchmark: the suite does not stall."""
    steps = [sh("tests", "true"), sh("bench", "true", exclusive=True),
             sh("emulation", "sleep 3", starts_with="tests")]
    t0 = time.monotonic()
    out = run_steps(steps, tmp_path, dict(os.environ), 300, header={}, echo=lambda _: None)
    assert [o.outcome for o in out] == [PASSED] * 3
    bench = next(o for o in out if o.step == "bench")
    assert bench.seconds < 2 and time.monotonic() - t0 < 6


def test_steps_that_cannot_run_say_why_and_the_rest_runs(tmp_path):
    steps = [sh("build-apex", "exit 1", early=True), sh("tests", "true"),
             sh("apex cases", "echo never", needs=("build-apex",)),
             sh("profile", "echo never", skip="no Nsight Compute (ncu) on this machine"),
             sh("cases", "true"), sh("report", "true", closing=True)]
    lines = []
    out = run_steps(steps, tmp_path, dict(os.environ), 300, header={}, echo=lines.append)
    got = {o.step: (o.outcome, o.reason) for o in out}
    assert got["build-apex"][0] == FAILED and got["tests"] == (PASSED, "") and got["cases"] == (PASSED, "")
    assert got["apex cases"] == (NOT_RUN, "build-apex did not pass (failed)")
    assert got["profile"] == (NOT_RUN, "no Nsight Compute (ncu) on this machine")
    assert not (tmp_path / "logs" / "apex cases.txt").exists()
    recorded = json.loads((tmp_path / "steps.json").read_text())["steps"]
    assert [s["reason"] for s in recorded if s["outcome"] == "not run"] == ["build-apex did not pass (failed)",
                                                                          "no Nsight Compute (ncu) on this machine"]
    assert "[gpu-suite] profile: not run: no Nsight Compute (ncu) on this machine" in lines


def test_a_step_of_a_wave_is_timed_when_it_ends_not_when_the_wave_reaches_it(tmp_path):
    """2026-11-28: a probe that answered in seconds read '96 s of 60 s', the time its wave took to reach it."""
    steps = [sh("slow", "sleep 3"), sh("quick", "true", with_previous=True, limit=2)]
    out = run_steps(steps, tmp_path, dict(os.environ), 300, header={}, echo=lambda _: None)
    by = {o.step: o for o in out}
    assert by["quick"].outcome == PASSED and by["quick"].seconds < 1.5, by["quick"]
    assert by["slow"].seconds >= 3
