#!/usr/bin/env python3
"""detectron2 NaiveSyncBatchNorm: variance as E[x^2] - E[x]^2, unclamped, goes negative near 1e3: NaN outputs.

The forward takes var = meansqr - mean * mean in float32 and passes it to rsqrt without a clamp. With
values near 1e3 and a spread of 1 the two terms are near 1e6 (float32 spacing 0.0625): the difference
cancels, goes negative on some channels, and rsqrt gives NaN on every rank for those channels.

What it runs: 2 processes (gloo, CPU), one training forward of NaiveSyncBatchNorm(67, stats_mode="")
(float32) on one sample of 67 channels x 1 x 1 per rank: 1000 + standard normal draws (seed 0).
Expected: torch.nn.BatchNorm2d in float64 over the two samples (finite outputs of -1 and 1). Severity:
silent non-finite outputs; reach: inputs with a large mean against their spread (rare after a conv).

The symptom: a non-finite output where BatchNorm2d's is finite. It agrees when every output is finite
and within 1e-3 of BatchNorm2d's (float32 arithmetic on inputs conditioned 1e3).

Upstream: none found (query "NaiveSyncBatchNorm variance negative NaN"). Needs only torch and
detectron2-layers. Exit codes: 1 the symptom above shows; 0 every rank agrees with BatchNorm as stated;
2 anything else (reason printed). With detectron2-layers 0.0.5 on torch 2.13.0 it exits 1 on CPU.
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
    from detectron2_layers.batch_norm import NaiveSyncBatchNorm  # detectron2/layers/batch_norm.py's class
except ImportError as exc:  # reported by main, exit 2
    NaiveSyncBatchNorm, IMPORT_ERROR = None, f"{type(exc).__name__}: {exc}"

C, SIZES, OFFSET = 67, (1, 1), 1000.0  # channels; samples per rank (1 x 1 each); the inputs' mean
TOL = 1e-3  # agreement
TIMEOUT_S, DEVICE = 45, "cpu"  # the whole run (the process group's own timeout is half of it); the device


def rank_main(rank, world):
    """The layer on this rank's part, BatchNorm2d on the whole batch: non-finite counts and the error."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(sum(SIZES), C, 1, 1, generator=g, dtype=torch.float64) + OFFSET).float().double()
    start, n = sum(SIZES[:rank]), SIZES[rank]
    y = NaiveSyncBatchNorm(C, stats_mode="").train()(x[start:start + n].float()).detach().double()
    want = torch.nn.BatchNorm2d(C).double().train()(x).detach()[start:start + n]
    err = float((y - want).abs().max())
    return dict(nonfinite=int((~torch.isfinite(y)).sum()), want_nonfinite=int((~torch.isfinite(want)).sum()),
                channels=sorted({int(c) for c in (~torch.isfinite(y)).nonzero()[:, 1]}),
                err=err if math.isfinite(err) else math.inf)


def judge(got):
    """(exit code, verdict line) from every rank's result."""
    if failures(got, len(SIZES)):
        return 2, f"OTHER: {failures(got, len(SIZES))}"
    res = [got[r][1] for r in range(len(SIZES))]
    facts = "; ".join(f"rank {r}: {v['nonfinite']} of {C} outputs NaN/inf (channels {v['channels'][:8]}), "
                      f"BatchNorm2d's {v['want_nonfinite']}" for r, v in enumerate(res))
    if any(v["nonfinite"] and not v["want_nonfinite"] for v in res):
        return 1, f"SYMPTOM SHOWS (non-finite): {facts}"
    err = max(v["err"] for v in res)
    if err <= TOL:
        return 0, f"no symptom (pass): finite, within {err:.3g} of torch.nn.BatchNorm2d over the whole batch"
    return 2, f"OTHER: finite but off torch.nn.BatchNorm2d by {err:.3g} (> {TOL}): {facts}"


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
    if NaiveSyncBatchNorm is None:
        print(f"OTHER: needs detectron2-layers ({IMPORT_ERROR})")
        return 2
    code, line = judge(run_ranks(rank_main, len(SIZES)))
    print(line)
    return code


if __name__ == "__main__":
    sys.exit(main())
