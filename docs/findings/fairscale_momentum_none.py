#!/usr/bin/env python3
"""fairscale SyncBatchNorm: momentum=None raises RuntimeError in its TorchScript running-statistics update.

torch.nn.BatchNorm accepts momentum=None (a cumulative moving average over num_batches_tracked).
fairscale's constructor accepts it too, but its training forward passes it to `_track_running_stats`, a
TorchScript function whose momentum is a float: RuntimeError "Expected a value of type 'float' for
argument 'momentum'".

What it runs: 2 processes (gloo, CPU), three training forwards of fairscale's SyncBatchNorm(8,
momentum=None) (float32, 3 and 4 samples of 4 x 3 per step) beside torch.nn.BatchNorm2d(8, momentum=None)
on the whole batch (float64). Expected: outputs and running statistics as BatchNorm2d's. Severity: an
error; reach: momentum=None.

The symptom: a RuntimeError whose message says momentum is expected to be a float. It agrees when every
step's output and the final running statistics are within 1e-4 relative of BatchNorm2d's.

Upstream: none found (fairscale's tracker, query "fairscale SyncBatchNorm momentum None TorchScript
float"); fairscale has had no release since 0.4.13 (2022). Needs only torch and fairscale. Exit codes: 1
the symptom above shows; 0 every rank agrees with BatchNorm as stated; 2 anything else (reason printed).
With fairscale 0.4.13 on torch 2.13.0 it exits 1 on CPU.
"""
import datetime
import math
import queue
import signal
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

try:
    from fairscale.experimental.nn import SyncBatchNorm
except ImportError as exc:  # reported by main, exit 2
    SyncBatchNorm, IMPORT_ERROR = None, f"{type(exc).__name__}: {exc}"

C, SIZES, HW, STEPS = 8, (3, 4), (4, 3), 3  # channels; samples per rank; spatial size; training forwards
TOL = 1e-4  # agreement: relative (float32 arithmetic)
MESSAGE = "Expected a value of type 'float' for argument 'momentum'"
TIMEOUT_S, DEVICE = 45, "cpu"  # the whole run (the process group's own timeout is half of it); the device


def rank_main(rank, world):
    """fairscale's layer on this rank's parts, BatchNorm2d on the whole batches: the largest relative error."""
    g = torch.Generator().manual_seed(0)
    start, n = sum(SIZES[:rank]), SIZES[rank]
    layer, bn = SyncBatchNorm(C, momentum=None).train(), torch.nn.BatchNorm2d(C, momentum=None).double().train()
    err = 0.0
    for _ in range(STEPS):
        x = torch.randn(sum(SIZES), C, *HW, generator=g, dtype=torch.float64)
        y, want = layer(x[start:start + n].float()).detach().double(), bn(x).detach()[start:start + n]
        err = max(err, float((y - want).abs().max() / want.abs().max()))
    for name in ("running_mean", "running_var"):
        a, b = getattr(layer, name).double(), getattr(bn, name)
        err = max(err, float((a - b).abs().max() / b.abs().max()))
    return dict(err=err if math.isfinite(err) else math.inf)


def judge(got):
    """(exit code, verdict line) from every rank's result."""
    raised = [what for kind, what in got.values() if kind == "raised"]
    if len(got) == len(SIZES) and raised and all(w.startswith("RuntimeError") and MESSAGE in w for w in raised) \
            and all(kind in ("raised", "value") for kind, _ in got.values()):
        return 1, f"SYMPTOM SHOWS (error): {raised[0].splitlines()[0]}"
    if failures(got, len(SIZES)):
        return 2, f"OTHER: {failures(got, len(SIZES))}"
    err = max(got[r][1]["err"] for r in range(len(SIZES)))
    if err <= TOL:
        return 0, (f"no symptom (pass): {STEPS} steps with momentum=None, outputs and running statistics within "
                   f"{err:.3g} relative of torch.nn.BatchNorm2d's")
    return 2, f"OTHER: momentum=None runs but is off torch.nn.BatchNorm2d by {err:.3g} relative (> {TOL})"


def failures(got, world):
    """What went wrong outside the layer's results (an exception, a death, the time limit), or "" if nothing."""
    parts = [f"rank {r}: {kind} {what}" for r, (kind, what) in sorted(got.items()) if kind != "value"]
    missing = sorted(set(range(world)) - set(got))
    return "; ".join(parts + [f"rank(s) {missing} still running after {TIMEOUT_S} s (killed)"] * bool(missing))


def _rank(fn, rank, world, port, results):
    """One process: join the group, run fn, put (rank, ("value", v) or ("raised", what)) on the queue."""
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=TIMEOUT_S // 2))
        out = ("value", fn(rank, world))
    except Exception as exc:  # reported to the parent, which judges it
        out = ("raised", f"{type(exc).__name__}: {exc}")
    results.put((rank, out))
    if dist.is_initialized():
        dist.destroy_process_group()


def run_ranks(fn, world):
    """fn(rank, world) in `world` processes: {rank: ("value", v) | ("raised", what) | ("died", how)}. Every wait
    is bounded by TIMEOUT_S; a process still running then is killed (its rank is missing); all are reaped."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(fn, r, world, port, results)) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + TIMEOUT_S
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    got = {}
    try:
        while True:
            rank, out = results.get(timeout=0.5)
            got[rank] = out
    except queue.Empty:
        pass
    for r, p in enumerate(procs):
        if p.is_alive():  # past the time limit: its rank is missing
            p.kill()
            p.join(timeout=5)
        elif r not in got:
            code = p.exitcode
            got[r] = ("died", f"exit code {code}" if code >= 0 else f"signal {signal.Signals(-code).name}")
    results.close()
    return got


def main():
    if SyncBatchNorm is None:
        print(f"OTHER: needs fairscale ({IMPORT_ERROR})")
        return 2
    code, line = judge(run_ranks(rank_main, len(SIZES)))
    print(line)
    return code


if __name__ == "__main__":
    sys.exit(main())
