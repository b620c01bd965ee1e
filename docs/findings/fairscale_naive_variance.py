#!/usr/bin/env python3
"""fairscale SyncBatchNorm: variance as E[x^2] - E[x]^2 in float32 cancels near 1e3: outputs far off (or NaN).

`_calculate_stats` takes the variance as mean(x * x) - mean(x)^2 in the input's dtype. With values near
1e3 and a spread below 1 the two terms are near 1e6, where float32's spacing is 0.0625: the difference
keeps no correct digit (here it is 0 instead of 0.015625; it can also go negative, and then rsqrt gives NaN).

What it runs: 2 processes (gloo, CPU), one training forward of fairscale's SyncBatchNorm (1 channel,
float32) on (N, 1) input, one sample per rank: 1000.0 and 1000.25. Expected: torch.nn.BatchNorm1d in
float64 over the two samples (outputs -0.9997 and 0.9997). Severity: silent wrong
normalization (or NaN); reach: inputs with a large mean against their spread (rare after a conv).

The symptom: an output off BatchNorm's by more than 0.1 (its outputs are -1 and 1), or non-finite. It
agrees within 1e-3 (float32 arithmetic on inputs conditioned 1e3).

Upstream: none found (fairscale's tracker, query "fairscale SyncBatchNorm variance E[x^2] cancellation
large mean"); fairscale has had no release since 0.4.13 (2022). Needs only torch and fairscale. Exit
codes: 1 the symptom above shows; 0 every rank agrees with BatchNorm as stated; 2 anything else (reason
printed). With fairscale 0.4.13 on torch 2.13.0 it exits 1 on CPU.
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

SIZES, VALUES = (1, 1), (1000.0, 1000.25)  # samples per rank; the whole batch (1 channel)
FAR, TOL = 0.1, 1e-3  # symptom: output off by more than FAR (or non-finite); agreement: within TOL
TIMEOUT_S, DEVICE = 45, "cpu"  # the whole run (the process group's own timeout is half of it); the device


def rank_main(rank, world):
    """fairscale's layer on this rank's part, BatchNorm1d on the whole batch: what the judge needs."""
    x = torch.tensor(VALUES, dtype=torch.float64).view(-1, 1)
    start, n = sum(SIZES[:rank]), SIZES[rank]
    layer, bn = SyncBatchNorm(1).train(), torch.nn.BatchNorm1d(1).double().train()
    y = layer(x[start:start + n].float()).detach().double()
    want = bn(x).detach()[start:start + n]
    return dict(y=y.flatten().tolist(), want=want.flatten().tolist())


def judge(got):
    """(exit code, verdict line) from every rank's result."""
    if failures(got, len(SIZES)):
        return 2, f"OTHER: {failures(got, len(SIZES))}"
    res = [got[r][1] for r in range(len(SIZES))]
    errs = [abs(a - b) if math.isfinite(a) else math.inf for v in res for a, b in zip(v["y"], v["want"])]
    facts = "; ".join(f"rank {r}: output {v['y']} (BatchNorm1d's {[round(w, 6) for w in v['want']]})"
                      for r, v in enumerate(res))
    if max(errs) > FAR:
        return 1, f"SYMPTOM SHOWS (mismatch): output off by {max(errs):.4g} > {FAR}: {facts}"
    if max(errs) <= TOL:
        return 0, f"no symptom (pass): within {TOL} of torch.nn.BatchNorm1d over the whole batch: {facts}"
    return 2, f"OTHER: off by {max(errs):.4g}, between {TOL} and {FAR}: {facts}"


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
