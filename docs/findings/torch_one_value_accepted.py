#!/usr/bin/env python3
"""torch: SyncBatchNorm accepts a training step with one value per channel in the whole process group,
and leaves running_var non-finite.

What it runs: 2 processes on CUDA (nccl with a GPU per rank, else gloo with both ranks on cuda:0) run
torch.nn.SyncBatchNorm(5) (float32) in training on 1-D features (as after global pooling): one sample on
rank 0, none on rank 1. Expected: what nn.BatchNorm1d does with the same whole batch of one sample: it
raises ValueError("Expected more than 1 value per channel when training, ..."). Actual (torch 2.11.0+cu130,
H200): SyncBatchNorm accepts it, normalizes the value to the bias, and running_var becomes non-finite (a
rounding residue divided by n - 1 = 0), which every later evaluation reads.

Cause: SyncBatchNorm checks the size only when one process runs (`size == 1 and world_size < 2` in
torch/nn/modules/_functions.py); pytorch#36865 asked for the check on the global count and pytorch#37133 added
it. Severity: silent non-finite (running_var). Reach: a last batch of one sample spread over ranks, 1-D
features, uncommon.

A fix would refuse the step as SyncBatchNorm's own one-process check does (ValueError "Expected more than 1
value per channel when training, got input size 1"), on the global count: only that refusal counts as fixed.
A past version (over plain-torch CPU stand-ins without a GPU, any error counted as a fix) was run on an
H200 (torch 2.11.0+cu130); no log of that run was kept. This file exits 2 on CPU: torch's
SyncBatchNorm runs only on CUDA.
Needs only torch and a GPU. Exit 1: the symptom shows (every rank accepts the step and running_var is
non-finite); 0: every rank refuses it as nn.BatchNorm1d does (a ValueError saying "Expected more than 1 value
per channel when training"); 2: anything else (no GPU, another error, accepted with a finite running_var, a
crash or a time-out).
"""
import datetime
import math
import socket
import sys
import time
from multiprocessing.connection import wait

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD, C = 2, 5
SIZES = (1, 0)  # one value per channel in the whole group
REFUSAL = "Expected more than 1 value per channel when training"
GROUP_TIMEOUT_S, DEADLINE_S, EXIT_GRACE_S = 30, 90, 10


def step(rank):
    """One training step on this rank's part; running_var afterwards, as a list."""
    x = torch.randn(sum(SIZES), C, generator=torch.Generator().manual_seed(0))
    part = x[sum(SIZES[:rank]):sum(SIZES[:rank + 1])]
    layer = torch.nn.SyncBatchNorm(C).cuda().train()
    layer(part.cuda())
    return layer.running_var.cpu().tolist()


def rank_main(rank, port, conn):
    """This rank's part (step); sends ("done", result) or ("raised", type, first line of the message)."""
    try:
        backend = "nccl" if torch.cuda.device_count() >= WORLD else "gloo"
        torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                                timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
        conn.send(("done", step(rank)))
    except Exception as e:  # noqa: BLE001 - reported to the parent, which judges it
        lines = str(e).strip().splitlines()
        conn.send(("raised", type(e).__name__, lines[0][:300] if lines else ""))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        conn.close()


def launch(rank_main):
    """Start the ranks; gather what they send until they exit or DEADLINE_S passes; kill what is left.
    Returns ({rank: [messages]}, {rank: exit code or signal}, hung: ranks killed at the deadline)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    pipes = [ctx.Pipe(duplex=False) for _ in range(WORLD)]
    procs = [ctx.Process(target=rank_main, args=(r, port, pipes[r][1]), daemon=True) for r in range(WORLD)]
    for p in procs:
        p.start()
    for _, w in pipes:
        w.close()
    messages, reading = {r: [] for r in range(WORLD)}, {pipes[r][0]: r for r in range(WORLD)}
    deadline = time.monotonic() + DEADLINE_S
    while reading and time.monotonic() < deadline:
        for conn in wait(list(reading), timeout=max(0.0, deadline - time.monotonic())):
            try:
                messages[reading[conn]].append(conn.recv())
            except EOFError:  # the rank exited (or died)
                del reading[conn]
    hung = sorted(reading.values())
    for r, p in enumerate(procs):
        p.join(timeout=0 if r in hung else EXIT_GRACE_S)
        if p.is_alive():
            p.kill()
            p.join(timeout=5)
    codes = {r: f"signal {-p.exitcode}" if p.exitcode and p.exitcode < 0 else p.exitcode for r, p in enumerate(procs)}
    return messages, codes, hung


def final(messages):
    """Each rank's last report: ("done", ...) or ("raised", type, message), or None if it sent none."""
    return {r: next((m for m in reversed(ms) if m[0] in ("done", "raised")), None) for r, ms in messages.items()}


def main():
    if not torch.cuda.is_available():
        print("OTHER: needs a GPU (torch's SyncBatchNorm runs only on CUDA)")
        return 2
    try:
        torch.nn.BatchNorm1d(C).train()(torch.randn(sum(SIZES), C))
        print("OTHER: nn.BatchNorm1d accepts one value per channel here, so there is nothing to compare with")
        return 2
    except ValueError as e:
        print(f"expected: nn.BatchNorm1d over the whole batch raises ValueError: {e}")
    messages, codes, hung = launch(rank_main)
    ends = final(messages)
    for r, e in ends.items():
        print(f"rank {r} ({SIZES[r]} samples): {e}; exit {codes[r]}")
    if hung or not all(ends.values()):
        print(f"OTHER: not every rank reported: exit codes {codes}; killed at the deadline: {hung}")
        return 2
    if all(e[0] == "raised" and e[1] == "ValueError" and REFUSAL in e[2] for e in ends.values()):
        print(f"no symptom (pass): every rank refuses the step as nn.BatchNorm1d does (ValueError: {REFUSAL})")
        return 0
    if all(e[0] == "done" for e in ends.values()):
        bad = {r: e[1] for r, e in ends.items() if not all(math.isfinite(v) for v in e[1])}
        if bad:
            print(f"SYMPTOM SHOWS (accepted): every rank accepted one value per channel and running_var is "
                  f"non-finite: {'; '.join(f'rank {r} {v}' for r, v in bad.items())}")
            return 1
        print(f"OTHER: accepted, but running_var is finite: {ends}")
        return 2
    print(f"OTHER: {ends}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
