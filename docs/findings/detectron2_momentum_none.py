#!/usr/bin/env python3
"""detectron2 NaiveSyncBatchNorm: momentum=None, affine=False or track_running_stats=False raise TypeError.

Its constructor (torch.nn.BatchNorm2d's) accepts the three options, but its training forward uses
self.momentum, self.weight / self.bias and self.running_mean / running_var as tensors and numbers, so
None meets arithmetic: TypeError "unsupported operand type(s) ... 'NoneType'". torch.nn.BatchNorm2d
supports all three.

What it runs: 2 processes (gloo, CPU), for each option a fresh NaiveSyncBatchNorm(1, stats_mode="")
with it, one training forward (float32, one 1 x 1 sample per rank: 0.5 and 2.0), beside
torch.nn.BatchNorm2d with the same option on both samples (float64). Severity: an error; reach: those
options.

The symptom: an option's forward raises TypeError naming NoneType. It agrees when every option's output
is within 1e-5 of BatchNorm2d's.

Upstream: none found (query "detectron2 NaiveSyncBatchNorm momentum None affine False TypeError").
Needs only torch and detectron2-layers. Exit codes: 1 the symptom above shows (and nothing else goes
wrong); 0 every rank agrees with BatchNorm as stated; 2 anything else (reason printed). With
detectron2-layers 0.0.5 on torch 2.13.0 it exits 1 on CPU.
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

SIZES, VALUES, TOL = (1, 1), (0.5, 2.0), 1e-5  # samples per rank; the whole batch (1 channel); agreement
OPTIONS = (dict(momentum=None), dict(affine=False), dict(track_running_stats=False))
TIMEOUT_S, DEVICE = 45, "cpu"  # the whole run (the process group's own timeout is half of it); the device


def rank_main(rank, world):
    """Each option: the layer on this rank's sample (its TypeError, or its error against BatchNorm2d)."""
    x = torch.tensor(VALUES, dtype=torch.float64).view(-1, 1, 1, 1)
    out = []
    for option in OPTIONS:
        want = torch.nn.BatchNorm2d(1, **option).double().train()(x).detach()[rank:rank + 1]
        try:
            y = NaiveSyncBatchNorm(1, stats_mode="", **option).train()(x[rank:rank + 1].float())
        except TypeError as exc:
            out.append(f"TypeError: {exc}")
            continue
        err = float((y.detach().double() - want).abs().max())
        out.append(err if math.isfinite(err) else math.inf)
    return out


def judge(got):
    """(exit code, verdict line) from every rank's result."""
    if failures(got, len(SIZES)):
        return 2, f"OTHER: {failures(got, len(SIZES))}"
    res = [got[r][1] for r in range(len(SIZES))]
    names = [", ".join(f"{k}={v}" for k, v in o.items()) for o in OPTIONS]
    facts = "; ".join(f"{n}: {r if isinstance(r, str) else f'off by {r:.3g}'}" for n, r in zip(names, res[0]))
    cells = [r for v in res for r in v]
    raised = [r for r in cells if isinstance(r, str)]
    wrong = [r for r in cells if not isinstance(r, str) and r > TOL]
    if raised and not wrong and all("NoneType" in r for r in raised):
        return 1, f"SYMPTOM SHOWS (error): {facts}"
    if not raised and not wrong:
        return 0, f"no symptom (pass): every option agrees with torch.nn.BatchNorm2d: {facts}"
    return 2, f"OTHER: {facts}"


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
