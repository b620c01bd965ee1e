"""A crash or hang, explained: the case once more with the build's collective debugging turned on.

Protocol: when a case crashes or hangs and the known-issues file does not
expect it, :func:`diagnose` runs the same task once more in a fresh pool of
freshly spawned interpreters with ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` in their
environment from the start (torch reads it when it is imported). At that
level torch wraps gloo and nccl process groups so that, before each
collective, the ranks compare what they are about to issue and raise
"Detected mismatch between collectives on ranks ..." naming both sides,
instead of aborting inside the transport or waiting forever. What the second
run said becomes ``Record.diagnosis``: its status, the attribution, each
rank's message and the lines of its output that speak of collectives. The
record's status stays what the first run observed: the second run explains,
it does not judge.

Costs one pool start (spawned interpreters import torch: seconds) and, if
the case hangs again, one more timeout; only unexpected crashes and hangs pay
it. Not available under torchrun (one job cannot start a second one).
"""

from __future__ import annotations

import re
from typing import Optional

from harness.engine.attribution import message as attribution_message
from harness.engine.pool import Pool, PoolStartError

DEBUG_ENV = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
# Lines of a rank's output that speak of its collectives (torch's wrapper, gloo, nccl).
SPEAKS = re.compile(r"mismatch|FingerPrint|collective|doesn't match|does not match", re.IGNORECASE)
MAX_LINES = 6


def tidy(line: str) -> str:
    """``line`` without the device options torch prints inside each collective fingerprint (``, TensorDeviceTypes=
    TensorOptions(...)``: the same for every tensor of a CPU or GPU run, and most of the line's length)."""
    key = ", TensorDeviceTypes="
    while key in line:
        start = line.index(key)
        i, depth = start + len(key), 0
        while i < len(line):
            depth += {"(": 1, ")": -1}.get(line[i], 0)
            i += 1
            if depth == 0 and line[i - 1] == ")":
                break
        line = line[:start] + line[i:]
    return line


def evidence(text: str) -> list[str]:
    """The lines of ``text`` that speak of collectives (at most a few, each cut to a readable length)."""
    out = []
    for line in (text or "").splitlines():
        line = tidy(line.strip())
        if line and SPEAKS.search(line) and line not in out and not line.startswith("File "):
            out.append(line[:1000])
        if len(out) == MAX_LINES:
            break
    return out


def diagnose(task, world_size: int, backend: str, device: str, timeout: float) -> dict:
    """Run ``task`` again with collective debugging and say what came out (see the module docstring)."""
    pool = Pool(world_size, backend=backend, device=device, setup_impls=(task.impl,), start_method="spawn",
                env=DEBUG_ENV, keep_failure_logs=False)
    try:
        outcome = pool.run(task, timeout=timeout)
    except PoolStartError as exc:
        return {"env": DEBUG_ENV, "status": None, "message": f"the debug run could not start: {exc}"[:2000],
                "ranks": [], "summary": None}
    finally:
        pool.kill()
    ranks = []
    for o in outcome.ranks:
        text = "\n".join(filter(None, [o.message, o.traceback, o.stack_dump]))
        ranks.append({"rank": o.rank, "status": o.status.value,
                      "message": tidy((f"{o.exception_type}: " if o.exception_type else "") + (o.message or ""))[:1500],
                      "evidence": evidence(text)})
    return {"env": DEBUG_ENV, "status": outcome.status.value, "message": tidy(attribution_message(outcome.ranks)),
            "ranks": ranks, "summary": summary(ranks)}


def summary(ranks: list[dict]) -> Optional[str]:
    """One line: the first rank's first line about collectives, else the first failing rank's message."""
    for r in ranks:
        if r["evidence"]:
            return f"rank {r['rank']}: {r['evidence'][0]}"
    for r in ranks:
        if r["status"] not in ("pass", "peer-failed") and r["message"]:
            first = next((line.strip() for line in r["message"].splitlines() if line.strip()), "")
            return f"rank {r['rank']}: {first[:600]}"
    return None
