#!/usr/bin/env python3
"""fairscale SyncBatchNorm: float16 input with float32 parameters gives a float32 output (BatchNorm: float16).

fairscale's training forward computes (x - mean) * (invstd * weight) + bias with the float32 weight and
bias, so type promotion makes the output float32; torch.nn.BatchNorm2d returns the input's dtype.

What it runs: 2 processes (gloo, CPU), one training forward of fairscale's SyncBatchNorm (8 channels,
float32 parameters and buffers, 3 and 5 samples of 5 x 4, float16 input, no count overflow) beside
torch.nn.BatchNorm2d with float32 parameters on float16 input (the dtype it returns) and in float64 over
the whole batch (the values). Severity: wrong dtype (memory and the next layer's dtype under autocast);
values fine; reach: half input with float32 parameters, the usual autocast setup.

The symptom: the output's dtype is float32 where BatchNorm2d's is float16. It agrees when the dtype is
BatchNorm2d's and the values are within 0.05 of BatchNorm2d's in float64 (float16 output rounding).

Upstream: none found (fairscale's tracker, query "fairscale SyncBatchNorm half input float32 output
dtype"); fairscale has had no release since 0.4.13 (2022). Needs only torch and fairscale. Exit codes: 1
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

C, SIZES, HW = 8, (3, 5), (5, 4)  # channels; samples per rank; spatial size
TOL = 0.05  # agreement of the values (float16 output rounding and statistics)
TIMEOUT_S, DEVICE = 45, "cpu"  # the whole run (the process group's own timeout is half of it); the device


def rank_main(rank, world):
    """fairscale's layer on this rank's part; BatchNorm2d's dtype and float64 values: what the judge needs."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(sum(SIZES), C, *HW, generator=g, dtype=torch.float64).half().double()
    start, n = sum(SIZES[:rank]), SIZES[rank]
    layer = SyncBatchNorm(C).train()
    want_dtype = torch.nn.BatchNorm2d(C).train()(x[start:start + n].half()).dtype
    y = layer(x[start:start + n].half())
    want = torch.nn.BatchNorm2d(C).double().train()(x).detach()[start:start + n]
    err = float((y.detach().double() - want).abs().max())
    return dict(dtype=str(y.dtype), want_dtype=str(want_dtype), err=err if math.isfinite(err) else math.inf)


def judge(got):
    """(exit code, verdict line) from every rank's result."""
    if failures(got, len(SIZES)):
        return 2, f"OTHER: {failures(got, len(SIZES))}"
    res = [got[r][1] for r in range(len(SIZES))]
    err = max(v["err"] for v in res)
    facts = (f"output dtype {sorted({v['dtype'] for v in res})} (BatchNorm2d's {res[0]['want_dtype']}), "
             f"values within {err:.3g} of BatchNorm2d's in float64")
    if any(v["dtype"] == "torch.float32" and v["want_dtype"] == "torch.float16" for v in res):
        return 1, f"SYMPTOM SHOWS (dtype): {facts}"
    if all(v["dtype"] == v["want_dtype"] for v in res) and err <= TOL:
        return 0, f"no symptom (pass): {facts}"
    return 2, f"OTHER: {facts} (tolerance {TOL})"


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
