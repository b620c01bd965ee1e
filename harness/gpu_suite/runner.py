"""Running the suite's steps: each in its own process group, under its limit, its outcome written at once.

Protocol:
- A step runs as a child in a new session (its own process group), output to
  its log. Past its limit it gets SIGTERM (harness commands reap their ranks),
  then SIGKILL :data:`~harness.gpu_suite.steps.KILL_AFTER_S` later, to the
  whole group; its outcome is ``timed out``.
- Steps run in waves: a step and the ``with_previous`` steps after it start
  together and are all joined before the next wave. ``early`` steps start
  with the first wave and ``starts_with`` steps with the step they name; both
  are joined at their own turn, under their own limit counted from their
  start. Before an ``exclusive`` step (one that times something) every
  ``early`` step still running (a build) is waited for; a ``starts_with`` step
  (CPU work planned to overlap) may run on beside it.
- After every step, ``steps.json`` in the work folder is rewritten: a suite
  stopped at any point leaves the outcome of everything that ran.
- A step is ``not run``, with the reason, when the plan says it cannot run
  here (``skip``), when a step it ``needs`` did not pass, when a required step
  failed before it, or when the budget is spent; every other step runs even
  after a failure.
- Ctrl-C or SIGTERM to the suite stops the steps in flight the same way
  (their groups get SIGTERM, then SIGKILL) before the exception goes on.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path
from typing import Callable, Optional

from harness import procs
from harness.gpu_suite.steps import KILL_AFTER_S, Step, step_limit



class Outcome(str, Enum):
    """How a step ended. A ``str`` whose value is what ``steps.json`` holds (JSON writes it as that string)."""

    PASSED = "passed"
    FAILED = "failed"
    TIMED_OUT = "timed out"
    NOT_RUN = "not run"

    def __str__(self) -> str:
        return self.value


@dataclass
class StepResult:
    """What one step did (a row of ``steps.json``, written with :func:`dataclasses.asdict`)."""

    step: str
    outcome: Outcome
    exit: Optional[int]
    seconds: float
    limit_s: int
    log: str
    command: list
    reason: str = ""  # why a step was not run

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.PASSED


class _Child:
    """A started step: its process, log file and deadline."""

    def __init__(self, step: Step, work: Path, env: dict, limit_s: int, cwd: Optional[Path]):
        self.step, self.limit_s, self.t0 = step, limit_s, time.monotonic()
        self.t_end: Optional[float] = None  # when the process was first seen ended (a wave is joined in order)
        logs = work / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.log = open(logs / step.log, "w", encoding="utf-8")
        self.out = open(work / step.stdout, "w", encoding="utf-8") if step.stdout else None
        child_env = {**env}
        for key, value in step.env.items():
            old = child_env.get(key)
            child_env[key] = f"{value}{os.pathsep}{old}" if key == "PYTHONPATH" and old and value else value
        try:
            self.proc: Optional[procs.Group] = procs.Group(
                step.argv, stdout=self.out or self.log, stderr=subprocess.STDOUT if self.out is None else self.log,
                env=child_env, cwd=cwd)
            self.error = None
        except OSError as exc:
            self.proc, self.error = None, exc
            self.log.write(f"could not start {step.argv[0]}: {exc}\n")

    def ended(self) -> bool:
        """Whether the step's process has ended (its end time is kept the first time this sees it)."""
        if self.proc is None:
            return True
        if self.t_end is None and self.proc.poll() is not None:
            self.t_end = time.monotonic()
        return self.t_end is not None

    def settle(self) -> None:
        """Wait for the step to end by itself or reach its deadline (its outcome is taken later, by wait)."""
        if self.proc is not None:
            self.proc.wait(self.t0 + self.limit_s - time.monotonic())

    def wait(self) -> StepResult:
        """Wait for the step (to its deadline), stop its group past it; its outcome."""
        code, outcome = None, Outcome.FAILED
        if self.proc is not None:
            code = self.proc.wait(self.t0 + self.limit_s - time.monotonic())
            if code is not None:
                outcome = Outcome.PASSED if code in self.step.ok_exits else Outcome.FAILED
            else:
                self.stop()
                code, outcome = self.proc.code, Outcome.TIMED_OUT
                self.log.write(f"\n[gpu-suite] stopped at its limit of {self.limit_s}s\n")
        self.close()
        end = self.t_end if self.t_end is not None else time.monotonic()
        return StepResult(self.step.name, outcome, code, round(end - self.t0, 1), self.limit_s,
                       self.step.log, list(self.step.argv))

    def stop(self) -> None:
        """SIGTERM the step's group, SIGKILL it if it is still there after the grace."""
        if self.proc is not None:
            self.proc.stop(term_grace=KILL_AFTER_S)

    def close(self) -> None:
        for f in (self.log, self.out):
            if f is not None and not f.closed:
                f.close()


def _watch(children: list[_Child], poll_s: float = 0.2) -> None:
    """Poll a wave's steps until each has ended or passed its deadline, noting when each ended."""
    while True:
        now = time.monotonic()
        live = [c for c in children if not c.ended() and now < c.t0 + c.limit_s]
        if not live:
            return
        time.sleep(poll_s)


def _waves(steps: list[Step]) -> list[list[Step]]:
    waves: list[list[Step]] = []
    for step in steps:
        if step.with_previous and waves:
            waves[-1].append(step)
        else:
            waves.append([step])
    return waves


def run_steps(steps: list[Step], work: Path, env: dict, budget_s: float, *, header: dict,
              cwd: Optional[Path] = None, echo: Callable[[str], None] = print) -> list[StepResult]:
    """Run ``steps`` (see the module docstring) within ``budget_s``; every outcome, in plan order, also written to
    ``work/steps.json``."""
    deadline = time.monotonic() + budget_s
    outcomes: list[StepResult] = []
    by_name: dict[str, StepResult] = {}
    ahead: dict[str, _Child] = {}  # started ahead of their turn (early, starts_with), not joined yet
    current: list[_Child] = []  # the wave being waited for
    failed_required: list[str] = []

    def record(o: StepResult) -> None:
        outcomes.append(o)
        by_name[o.step] = o
        (work / "steps.json").write_text(json.dumps({**header, "budget_s": budget_s,
                                                     "steps": [asdict(x) for x in outcomes]}, indent=2))
        tail = f": {o.reason}" if o.reason else ""
        echo(f"[gpu-suite] {o.step}: {o.outcome}" + (f" (exit {o.exit})" if o.exit not in (0, None) else "")
             + (f" in {o.seconds:.0f}s of {o.limit_s}s" if o.outcome is not Outcome.NOT_RUN else tail))

    def not_run(step: Step, reason: str) -> StepResult:
        return StepResult(step.name, Outcome.NOT_RUN, None, 0.0, 0, step.log, list(step.argv), reason)

    def why_not(step: Step) -> str:
        """Why ``step`` cannot start now (its budget aside), or ''."""
        if step.skip:
            return step.skip
        if failed_required and not step.closing:
            return f"the required step {failed_required[0]} failed"
        for need in step.needs:
            got = by_name.get(need)
            if got is not None and not got.ok:
                return f"{need} did not pass ({got.outcome})"
        return ""

    def start(step: Step) -> Optional[_Child]:
        """Start ``step`` under its share of the budget; None when none is left."""
        limit = step_limit(step, deadline - time.monotonic())
        if not limit:
            return None
        echo(f"[gpu-suite] {step.name}: started (at most {limit}s)")
        return _Child(step, work, env, limit, cwd)

    def start_ahead(trigger: Optional[str]) -> None:
        for step in steps:
            if step.name in ahead or step.name in by_name:
                continue
            if (trigger is None and step.early) or (trigger is not None and step.starts_with == trigger):
                if not why_not(step):
                    child = start(step)
                    if child is not None:
                        ahead[step.name] = child

    try:
        start_ahead(None)
        for wave in _waves(steps):
            planned: list[tuple[Step, object]] = []  # (step, child or the reason it is not run)
            for step in wave:
                reason = why_not(step)
                child = ahead.pop(step.name, None)
                if reason:
                    if child is not None:
                        child.stop()
                        child.close()
                    planned.append((step, reason))
                    continue
                if child is None:
                    if step.exclusive:
                        for other in ahead.values():
                            if other.step.early:
                                other.settle()
                    child = start(step)
                if child is None:
                    planned.append((step, "the suite's time budget was spent"))
                    continue
                current.append(child)
                planned.append((step, child))
                start_ahead(step.name)
            _watch([c for _, c in planned if not isinstance(c, str)])
            for step, child in planned:
                if isinstance(child, str):
                    record(not_run(step, child))
                    continue
                outcome = child.wait()
                current.remove(child)
                record(outcome)
                if step.required and not outcome.ok:
                    failed_required.append(step.name)
    finally:
        for child in [*current, *ahead.values()]:
            child.stop()
            child.close()
    return outcomes
