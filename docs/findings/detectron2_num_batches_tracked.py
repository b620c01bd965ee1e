#!/usr/bin/env python3
"""detectron2 NaiveSyncBatchNorm: num_batches_tracked stays 0 through training steps.

Its training forward updates running_mean and running_var itself and never increments
num_batches_tracked, which torch.nn.BatchNorm increments once per training forward.

What it runs: 2 processes (gloo, CPU), two training forwards of NaiveSyncBatchNorm(8, stats_mode="")
(float32, 3 samples of 4 x 3 per rank) beside torch.nn.BatchNorm2d on the whole batch (float64).
Expected: num_batches_tracked 2 on every rank. Severity: silent wrong buffer; reach: what reads it
(checkpoints).

The symptom: num_batches_tracked is still 0 on some rank after the steps while BatchNorm2d's is 2. It
agrees when it equals BatchNorm2d's on every rank.

Upstream: none found (query "NaiveSyncBatchNorm num_batches_tracked"). Needs only torch and
detectron2-layers. Exit codes: 1 the symptom above shows; 0 every rank agrees with BatchNorm as stated;
2 anything else (reason printed). With detectron2-layers 0.0.5 on torch 2.13.0 it exits 1 on CPU.
"""
import datetime
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

C, SIZES, HW, STEPS = 8, (3, 3), (4, 3), 2  # channels; samples per rank; spatial size; training forwards
TIMEOUT_S, DEVICE = 45, "cpu"  # the whole run (the process group's own timeout is half of it); the device


def rank_main(rank, world):
    """The layer on this rank's parts, BatchNorm2d on the whole batches: the two counters."""
    g = torch.Generator().manual_seed(0)
    start, n = sum(SIZES[:rank]), SIZES[rank]
    layer, bn = NaiveSyncBatchNorm(C, stats_mode="").train(), torch.nn.BatchNorm2d(C).double().train()
    for _ in range(STEPS):
        x = torch.randn(sum(SIZES), C, *HW, generator=g, dtype=torch.float64)
        layer(x[start:start + n].float()), bn(x)
    return dict(got=int(layer.num_batches_tracked), want=int(bn.num_batches_tracked))


def judge(got):
    """(exit code, verdict line) from every rank's result."""
    if failures(got, len(SIZES)):
        return 2, f"OTHER: {failures(got, len(SIZES))}"
    res = [got[r][1] for r in range(len(SIZES))]
    facts = "; ".join(f"rank {r}: num_batches_tracked {v['got']} (BatchNorm2d's {v['want']})"
                      for r, v in enumerate(res))
    if any(v["got"] == 0 and v["want"] == STEPS for v in res):
        return 1, f"SYMPTOM SHOWS (mismatch): num_batches_tracked stays 0 after {STEPS} training steps: {facts}"
    if all(v["got"] == v["want"] == STEPS for v in res):
        return 0, f"no symptom (pass): counts training steps as torch.nn.BatchNorm2d does: {facts}"
    return 2, f"OTHER: neither 0 nor BatchNorm2d's count: {facts}"


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
