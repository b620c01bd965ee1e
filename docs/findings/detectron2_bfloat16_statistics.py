#!/usr/bin/env python3
"""detectron2 NaiveSyncBatchNorm computes bfloat16 statistics in bfloat16: outputs far off BatchNorm's.

NaiveSyncBatchNorm upcasts only float16 input (`half_input = input.dtype == torch.float16`); bfloat16
input has its mean, mean square and variance (E[x^2] - E[x]^2) computed in bfloat16, 8 significant bits:
at a mean of 5 standard deviations the variance keeps about one correct digit, at 30 it is 0 or
negative and the output is hundreds of times too large, or NaN. torch.nn.BatchNorm2d computes bfloat16
statistics in float32.

What it runs: 2 processes (gloo, CPU), each with 4 samples of 4 channels x 8 x 8 in bfloat16, float32
parameters, stats_mode="": one training forward on inputs of mean 5 and spread 1, then (a fresh layer)
one on inputs of mean 30 and spread 1. Expected: torch.nn.BatchNorm2d in float64 over the whole batch
(the same bfloat16-rounded values). Severity: silent wrong outputs and running statistics, NaN at larger
means; reach: bfloat16 AMP (`AMPTrainer(precision=torch.bfloat16)`; the default float16 is upcast).

The symptom: at either mean an output off BatchNorm2d's by more than 0.1 (outputs are of order 1), or
non-finite. It agrees when every output is within 0.05 of BatchNorm2d's (bfloat16 rounding
of the input is shared; the output is float32). A note, not the symptom: the output's dtype is float32
where torch.nn.BatchNorm2d returns bfloat16.

Upstream: none found (queries "NaiveSyncBatchNorm bfloat16 NaN variance", "detectron2 NaiveSyncBatchNorm
bfloat16 half_input float16 upcast"). Needs only torch and detectron2-layers (detectron2's layers
packaged on PyPI). Exit codes: 1 the symptom above shows; 0 every rank agrees with BatchNorm as stated;
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

C, SIZES, HW, MEANS = 4, (4, 4), (8, 8), (5.0, 30.0)  # channels; samples per rank; spatial size; input means
FAR, TOL = 0.1, 0.05  # symptom: off by more than FAR (or non-finite); agreement: within TOL
TIMEOUT_S, DEVICE = 45, "cpu"  # the whole run (the process group's own timeout is half of it); the device


def rank_main(rank, world):
    """At each mean: the layer on this rank's part, BatchNorm2d on the whole batch; errors and dtypes."""
    g = torch.Generator().manual_seed(0)
    start, n = sum(SIZES[:rank]), SIZES[rank]
    out = dict(err=[], nonfinite=[])
    for mean in MEANS:
        x = (torch.randn(sum(SIZES), C, *HW, generator=g, dtype=torch.float64) + mean).bfloat16().double()
        layer = NaiveSyncBatchNorm(C, stats_mode="").train()
        y = layer(x[start:start + n].bfloat16()).detach()
        want = torch.nn.BatchNorm2d(C).double().train()(x).detach()[start:start + n]
        out["dtype"], out["want_dtype"] = str(y.dtype), str(torch.nn.BatchNorm2d(C).train()(x.bfloat16()).dtype)
        err = float((y.double() - want).abs().max())
        out["err"].append(err if math.isfinite(err) else math.inf)
        out["nonfinite"].append(int((~torch.isfinite(y)).sum()))
    return out


def judge(got):
    """(exit code, verdict line) from every rank's result."""
    if failures(got, len(SIZES)):
        return 2, f"OTHER: {failures(got, len(SIZES))}"
    res = [got[r][1] for r in range(len(SIZES))]
    err = [max(v["err"][i] for v in res) for i in range(len(MEANS))]
    bad = [sum(v["nonfinite"][i] for v in res) for i in range(len(MEANS))]
    facts = (", ".join(f"at mean {m:g}: output off by up to {e:.4g}, {b} non-finite values"
                       for m, e, b in zip(MEANS, err, bad, strict=True))
             + f" (note: output dtype {res[0]['dtype']}, torch.nn.BatchNorm2d's {res[0]['want_dtype']})")
    if max(err) > FAR or any(bad):
        return 1, f"SYMPTOM SHOWS (mismatch): bfloat16 statistics, threshold {FAR}: {facts}"
    if max(err) <= TOL:
        return 0, f"no symptom (pass): within {TOL} of torch.nn.BatchNorm2d over the whole batch: {facts}"
    return 2, f"OTHER: neither agreement within {TOL} nor the symptom: {facts}"


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
