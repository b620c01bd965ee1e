#!/usr/bin/env python3
"""fairscale SyncBatchNorm.convert_sync_batchnorm: a converted BatchNorm1d trains, then eval raises ValueError.

Written by hand (a converter). The converter turns every _BatchNorm, BatchNorm1d included (its
docstring's own example is Linear + BatchNorm1d), into fairscale's SyncBatchNorm, a BatchNorm2d.
Training takes fairscale's own path, which accepts 2-D input; eval falls back to BatchNorm2d.forward,
which refuses it: ValueError "expected 4D input (got 2D input)".

What it runs: 2 processes (gloo, CPU) convert the docstring's model (Linear(20, 100) + BatchNorm1d(100),
float64), train it one step on 3 and 5 samples, then evaluate. Expected: eval as the unconverted model's
torch.nn.BatchNorm1d after a training step on the whole batch (8 samples). Severity: an error at eval
after a training that looked fine; reach: any converted model with BatchNorm1d (or BatchNorm3d).

The symptom: eval raises ValueError with "expected 4D input". It agrees when eval works and its output is
within 1e-9 relative of BatchNorm1d's.

Upstream: none found (fairscale's tracker, query "fairscale SyncBatchNorm convert_sync_batchnorm
BatchNorm1d expected 4D input"); fairscale has had no release since 0.4.13 (2022). Needs only torch and
fairscale. Exit codes: 1 the symptom above shows; 0 every rank agrees with BatchNorm as stated; 2
anything else (reason printed). With fairscale 0.4.13 on torch 2.13.0 it exits 1 on CPU.
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

SIZES, C, TOL = (3, 5), 100, 1e-9  # samples per rank; features; agreement (float64)
TIMEOUT_S, DEVICE = 45, "cpu"  # the whole run (the process group's own timeout is half of it); the device


def rank_main(rank, world):
    """Train the converted model one step on this rank's part, then evaluate it: the eval error or output."""
    torch.manual_seed(0)  # the same Linear weights and inputs on every rank
    x = torch.randn(sum(SIZES), 20, dtype=torch.float64)
    start, n = sum(SIZES[:rank]), SIZES[rank]
    model = torch.nn.Sequential(torch.nn.Linear(20, C), torch.nn.BatchNorm1d(C)).double()
    reference = torch.nn.Sequential(torch.nn.Linear(20, C), torch.nn.BatchNorm1d(C)).double()
    reference.load_state_dict(model.state_dict())
    model = SyncBatchNorm.convert_sync_batchnorm(model).double()
    model(x[start:start + n]).sum().backward()  # a training step: fairscale's path, fine with 2-D input
    reference(x)
    model.eval(), reference.eval()
    try:
        got = model(x[start:start + n])
    except ValueError as exc:
        return dict(eval_error=f"ValueError: {exc}")
    want = reference(x[start:start + n])
    err = float((got - want).abs().max() / want.abs().max())
    return dict(err=err if math.isfinite(err) else math.inf)


def judge(got):
    """(exit code, verdict line) from every rank's result."""
    if failures(got, len(SIZES)):
        return 2, f"OTHER: {failures(got, len(SIZES))}"
    res = [got[r][1] for r in range(len(SIZES))]
    errors = [v["eval_error"] for v in res if "eval_error" in v]
    if errors and all("expected 4D input" in e for e in errors):
        return 1, f"SYMPTOM SHOWS (error): the converted BatchNorm1d trained, then eval raised {errors[0]}"
    if errors:
        return 2, f"OTHER: eval raised {errors[0]}"
    err = max(v["err"] for v in res)
    if err <= TOL:
        return 0, f"no symptom (pass): eval works, within {err:.3g} relative of torch.nn.BatchNorm1d's"
    return 2, f"OTHER: eval works but is off torch.nn.BatchNorm1d's by {err:.3g} relative (> {TOL})"


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
