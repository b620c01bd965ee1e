#!/usr/bin/env python3
"""detectron2 NaiveSyncBatchNorm: running_var is updated with the biased (population) variance.

Its training forward updates running_var with var = E[x^2] - E[x]^2, the population variance;
torch.nn.BatchNorm updates it with the unbiased variance (times n / (n - 1)). With 2 values per channel
in the group that is a factor of 2 on the batch's contribution.

What it runs: 2 processes (gloo, CPU), one training forward of NaiveSyncBatchNorm(1, stats_mode="")
(float32, momentum 0.1) on one 1 x 1 sample per rank: 0.5 and 2.0. Expected: torch.nn.BatchNorm2d's
running_var in float64 over the two samples: 0.9 + 0.1 * 1.125 = 1.0125. Severity: silent wrong running
statistics (relative error 1/n; negligible at detectron2's head sizes); reach: every training step.

The symptom: running_var equals the biased update (0.9 + 0.1 * 0.5625 = 0.95625) within 1e-6 relative and
not BatchNorm2d's. It agrees when running_var is within 1e-6 relative of BatchNorm2d's.

Upstream: noted in 2020 while chasing an accuracy gap (pytorch#40600, a not-for-land investigation) and
not changed. Needs only torch and detectron2-layers. Exit codes: 1 the symptom above shows; 0 every rank
agrees with BatchNorm as stated; 2 anything else (reason printed). With detectron2-layers 0.0.5 on torch
2.13.0 it exits 1 on CPU.
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

SIZES, VALUES, MOMENTUM, TOL = (1, 1), (0.5, 2.0), 0.1, 1e-6  # per rank; the whole batch; momentum; relative
TIMEOUT_S, DEVICE = 45, "cpu"  # the whole run (the process group's own timeout is half of it); the device


def rank_main(rank, world):
    """The layer on this rank's sample, BatchNorm2d on both: the two running variances."""
    x = torch.tensor(VALUES, dtype=torch.float64).view(-1, 1, 1, 1)
    layer = NaiveSyncBatchNorm(1, momentum=MOMENTUM, stats_mode="").train()
    bn = torch.nn.BatchNorm2d(1, momentum=MOMENTUM).double().train()
    layer(x[rank:rank + 1].float()), bn(x)
    biased = (1 - MOMENTUM) + MOMENTUM * float(x.var(correction=0))
    return dict(got=float(layer.running_var), want=float(bn.running_var), biased=biased)


def judge(got):
    """(exit code, verdict line) from every rank's result."""
    if failures(got, len(SIZES)):
        return 2, f"OTHER: {failures(got, len(SIZES))}"
    res = [got[r][1] for r in range(len(SIZES))]
    facts = "; ".join(f"rank {r}: running_var {v['got']:.7g} (BatchNorm2d's {v['want']:.7g}, the biased update "
                      f"{v['biased']:.7g})" for r, v in enumerate(res))
    if all(abs(v["got"] - v["want"]) <= TOL * v["want"] for v in res):
        return 0, f"no symptom (pass): running_var as torch.nn.BatchNorm2d's: {facts}"
    if all(abs(v["got"] - v["biased"]) <= TOL * v["biased"] for v in res):
        return 1, f"SYMPTOM SHOWS (mismatch): running_var updated with the biased variance: {facts}"
    return 2, f"OTHER: running_var neither BatchNorm2d's nor the biased update: {facts}"


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
