#!/usr/bin/env python3
"""fairscale SyncBatchNorm: an empty rank makes every rank's output and running statistics NaN.

`_calculate_stats` weights each rank's mean and mean square by count / total count; an empty rank's
mean over no values is NaN (0/0), and NaN times its weight 0 is still NaN, so the all_reduce spreads it
to every rank: the other rank's outputs and both ranks' running_mean and running_var are NaN.

What it runs: 2 processes (gloo, CPU), one training forward of fairscale's SyncBatchNorm (1 channel,
float32, affine=False) on (N, 1) input: rank 0 holds no sample, rank 1 two (0.5 and 2.0). Expected:
torch.nn.BatchNorm1d in float64 over those two samples (outputs -1 and 1, finite running statistics).
Severity: silent non-finite outputs, gradients and running statistics on every rank; reach: an empty
rank (uneven last batches, detection heads).

The symptom: rank 1's output or any rank's running_mean / running_var is NaN or inf (BatchNorm's are
finite). It agrees when all are finite and within 1e-5 relative of BatchNorm's.

Upstream: none found (fairscale's tracker, query "fairscale SyncBatchNorm empty rank zero batch NaN");
fairscale has had no release since 0.4.13 (2022). Needs only torch and fairscale. Exit codes: 1 the
symptom above shows; 0 every rank agrees with BatchNorm as stated; 2 anything else (reason printed).
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

SIZES, VALUES = (0, 2), (0.5, 2.0)  # samples per rank; the whole batch's values (1 channel)
TOL = 1e-5  # agreement: relative, float32 arithmetic
TIMEOUT_S, DEVICE = 45, "cpu"  # the whole run (the process group's own timeout is half of it); the device


def rank_main(rank, world):
    """fairscale's layer on this rank's part, BatchNorm1d on the whole batch: what the judge needs."""
    x = torch.tensor(VALUES, dtype=torch.float64).view(-1, 1)
    start, n = sum(SIZES[:rank]), SIZES[rank]
    layer = SyncBatchNorm(1, affine=False).train()
    bn = torch.nn.BatchNorm1d(1, affine=False).double().train()
    y = layer(x[start:start + n].float()).detach().double()
    want = bn(x).detach()[start:start + n]
    return dict(y=y.flatten().tolist(), want=want.flatten().tolist(),
                stats=[layer.running_mean.item(), layer.running_var.item()],
                want_stats=[bn.running_mean.item(), bn.running_var.item()])


def close(a, b):
    return all(math.isfinite(u) and abs(u - v) <= TOL * max(abs(v), 1.0) for u, v in zip(a, b))


def judge(got):
    """(exit code, verdict line) from every rank's result."""
    if failures(got, len(SIZES)):
        return 2, f"OTHER: {failures(got, len(SIZES))}"
    res = [got[r][1] for r in range(len(SIZES))]
    facts = "; ".join(f"rank {r}: output {v['y']} (BatchNorm1d's {[round(w, 6) for w in v['want']]}), running "
                      f"mean, var {v['stats']} (BatchNorm1d's {[round(w, 6) for w in v['want_stats']]})"
                      for r, v in enumerate(res))
    nonfinite = [not all(map(math.isfinite, v["y"] + v["stats"])) for v in res]
    if any(nonfinite):
        return 1, f"SYMPTOM SHOWS (non-finite): NaN/inf where BatchNorm1d is finite: {facts}"
    if all(close(v["y"] + v["stats"], v["want"] + v["want_stats"]) for v in res):
        return 0, f"no symptom (pass): agrees with torch.nn.BatchNorm1d over the whole batch: {facts}"
    return 2, f"OTHER: finite but not BatchNorm1d's: {facts}"


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
