"""Running the suite's steps: each in its own process group, under its limit, its outcome written at once.

Protocol:
- A step runs as a child in a new session (its own process group), output to
  its log. Past its limit it gets SIGTERM (harness commands reap their ranks),
  then SIGKILL :data:`~harness.gpu_suite.steps.KILL_AFTER_S` later, to the
  whole group; its outcome is ``timed out``.
- ``early`` steps start with the first one and are joined at their turn,
  under their own limit counted from their start.
- After every step, ``steps.json`` in the work folder is rewritten: a suite
  stopped at any point leaves the outcome of everything that ran.
- A required step that fails stops the suite; every other step runs even
  after a failure. A step not started for want of budget is ``not run``.
- Ctrl-C or SIGTERM to the suite stops the steps in flight the same way
  (their groups get SIGTERM, then SIGKILL) before the exception goes on.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

from harness.gpu_suite.steps import KILL_AFTER_S, Step, step_limit

PASSED, FAILED, TIMED_OUT, NOT_RUN = "passed", "failed", "timed out", "not run"


@dataclass
class Outcome:
    """What one step did."""

    step: str
    outcome: str  # passed | failed | timed out | not run
    exit: Optional[int]
    seconds: float
    limit_s: int
    log: str
    command: list

    @property
    def ok(self) -> bool:
        return self.outcome == PASSED


class _Child:
    """A started step: its process, log file and deadline."""

    def __init__(self, step: Step, work: Path, env: dict, limit_s: int, cwd: Optional[Path]):
        self.step, self.limit_s, self.t0 = step, limit_s, time.monotonic()
        logs = work / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.log = open(logs / step.log, "w", encoding="utf-8")
        self.out = open(work / step.stdout, "w", encoding="utf-8") if step.stdout else None
        child_env = {**env}
        for key, value in step.env.items():
            old = child_env.get(key)
            child_env[key] = f"{value}{os.pathsep}{old}" if key == "PYTHONPATH" and old and value else value
        try:
            self.proc = subprocess.Popen(step.argv, stdout=self.out or self.log, stderr=subprocess.STDOUT if
                                         self.out is None else self.log, stdin=subprocess.DEVNULL, env=child_env,
                                         cwd=cwd, start_new_session=True)
            self.error = None
        except OSError as exc:
            self.proc, self.error = None, exc
            self.log.write(f"could not start {step.argv[0]}: {exc}\n")

    def wait(self) -> Outcome:
        """Wait for the step (to its deadline), stop its group past it; its outcome."""
        code, outcome = None, FAILED
        if self.proc is not None:
            try:
                code = self.proc.wait(timeout=max(0.0, self.t0 + self.limit_s - time.monotonic()))
                outcome = PASSED if code in self.step.ok_exits else FAILED
            except subprocess.TimeoutExpired:
                self.stop()
                code, outcome = self.proc.returncode, TIMED_OUT
                self.log.write(f"\n[gpu-suite] stopped at its limit of {self.limit_s}s\n")
        self.close()
        return Outcome(self.step.name, outcome, code, round(time.monotonic() - self.t0, 1), self.limit_s,
                       self.step.log, list(self.step.argv))

    def stop(self) -> None:
        """SIGTERM the step's group, SIGKILL it if it is still there after the grace."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, grace in ((signal.SIGTERM, KILL_AFTER_S), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        try:  # what is left of the group (a rank that outlived its parent)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        for f in (self.log, self.out):
            if f is not None and not f.closed:
                f.close()


def run_steps(steps: list[Step], work: Path, env: dict, budget_s: float, *, header: dict,
              cwd: Optional[Path] = None, echo: Callable[[str], None] = print) -> list[Outcome]:
    """Run ``steps`` in order within ``budget_s``; every outcome, also written to ``work/steps.json``."""
    deadline = time.monotonic() + budget_s
    outcomes: list[Outcome] = []
    started: dict[str, _Child] = {}  # early steps not joined yet
    current: list[_Child] = []  # the step being waited for

    def record(o: Outcome) -> None:
        outcomes.append(o)
        (work / "steps.json").write_text(json.dumps({**header, "budget_s": budget_s,
                                                     "steps": [asdict(x) for x in outcomes]}, indent=2))
        echo(f"[gpu-suite] {o.step}: {o.outcome}" + (f" (exit {o.exit})" if o.exit not in (0, None) else "")
             + f" in {o.seconds:.0f}s of {o.limit_s}s")

    try:
        for step in (s for s in steps if s.early):
            started[step.name] = _Child(step, work, env, step.limit_s, cwd)
            echo(f"[gpu-suite] {step.name}: started early")
        failed_required = False
        for step in steps:
            if failed_required and not step.closing:
                child = started.pop(step.name, None)
                if child:
                    child.stop()
                    child.close()
                record(Outcome(step.name, NOT_RUN, None, 0.0, 0, step.log, list(step.argv)))
                continue
            child = started.pop(step.name, None)
            if child is None:
                limit = step_limit(step, deadline - time.monotonic())
                if not limit:
                    record(Outcome(step.name, NOT_RUN, None, 0.0, 0, step.log, list(step.argv)))
                    continue
                echo(f"[gpu-suite] {step.name}: started (at most {limit}s)")
                child = _Child(step, work, env, limit, cwd)
            current[:] = [child]
            outcome = child.wait()
            current.clear()
            record(outcome)
            if step.required and not outcome.ok:
                failed_required = True
    finally:
        for child in [*current, *started.values()]:
            child.stop()
            child.close()
    return outcomes
