#!/usr/bin/env python3
"""torch: a training step in which every rank is empty moves SyncBatchNorm's running statistics.

What it runs: 2 processes on CUDA (nccl with a GPU per rank, else gloo with both ranks on cuda:0) run
torch.nn.SyncBatchNorm(5) (float32) through three training steps with per-rank batch sizes (3, 2), (0, 0),
(2, 3) of shape (n, 5, 4); torch.nn.BatchNorm1d(5) in float64 runs on each step's whole batch beside it.
Expected: in the all-empty step running_mean and running_var stay as they were (nn.BatchNorm1d counts the
step and leaves them, as pytorch#36530 asked of SyncBatchNorm). Actual (torch 2.11.0+cu130, H200): both
shrink by (1 - momentum), 1.25428 -> 1.12886 for running_var's channel 0, and stay off afterwards.

Cause: pytorch#74944 made the all-empty step run; every gathered row is filtered out and the merge of no
rows updates the running statistics as if the batch mean and variance were 0. Severity: silent wrong value
(running statistics, then every evaluation). Reach: layers fed by a sampler that can leave every rank empty
at once (detection heads), uncommon.

A past version of this file (the same check, over plain-torch CPU stand-ins without a GPU) exited 1 on CUDA
(H200, torch 2.11.0+cu130, gloo, the 2026-11-28 suite). This file exits 2 on CPU: torch's SyncBatchNorm runs
only on CUDA.
Needs only torch and a GPU. Exit 1: the symptom shows (in the all-empty step the running statistics move by
more than 1e-3 relative while nn.BatchNorm1d's stay); 0: every step's running statistics match
nn.BatchNorm1d's within 1e-5 relative on every rank; 2: anything else (no GPU, an error, a crash, a time-out).
"""
import datetime
import socket
import sys
import time
from multiprocessing.connection import wait

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD, C = 2, 5
STEP_SIZES = [(3, 2), (0, 0), (2, 3)]
EMPTY_STEP = 1
SHOWS, AGREES = 1e-3, 1e-5  # relative change / error of the running statistics
GROUP_TIMEOUT_S, DEADLINE_S, EXIT_GRACE_S = 30, 90, 10


def step(rank):
    """The three steps on this rank's part, beside BatchNorm1d on the whole batch: per step, for running_mean
    and running_var, (expected, actual) as lists."""
    g = torch.Generator().manual_seed(0)
    layer = torch.nn.SyncBatchNorm(C).cuda()
    bn = torch.nn.BatchNorm1d(C).double()
    seen = []
    for sizes in STEP_SIZES:
        xs = [torch.randn(n, C, 4, generator=g) * 2 + 1 for n in sizes]
        bn(torch.cat(xs).double()).sum().backward()
        layer(xs[rank].cuda().requires_grad_()).sum().backward()
        seen.append({name: (getattr(bn, name).tolist(), getattr(layer, name).double().cpu().tolist())
                     for name in ("running_mean", "running_var")})
    return seen


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


def rel(a, b):
    return max(abs(x - y) for x, y in zip(a, b)) / max(max(abs(y) for y in b), 1e-30)


def main():
    if not torch.cuda.is_available():
        print("OTHER: needs a GPU (torch's SyncBatchNorm runs only on CUDA)")
        return 2
    messages, codes, hung = launch(rank_main)
    ends = final(messages)
    if not all(e and e[0] == "done" for e in ends.values()):
        print(f"OTHER: not every rank finished: {ends}; exit codes {codes}; killed at the deadline: {hung}")
        return 2
    moved, worst = [], 0.0
    for r, (_, seen) in ends.items():
        for s, stats in enumerate(seen):
            for name, (want, got) in stats.items():
                err = rel(got, want)
                worst = max(worst, err)
                print(f"rank {r} step {s} {name}: expected {want[0]:.6g}, actual {got[0]:.6g} (channel 0); "
                      f"max rel err {err:.3g}")
            if s == EMPTY_STEP:
                for name, (want, got) in stats.items():
                    before_want, before_got = seen[s - 1][name]
                    if rel(want, before_want) == 0 and rel(got, before_got) > SHOWS:
                        moved.append(f"rank {r} {name} {before_got[0]:.6g} -> {got[0]:.6g}")
    if moved:
        print(f"SYMPTOM SHOWS (mismatch): the all-empty step moved the running statistics (> {SHOWS:g} relative) "
              f"where nn.BatchNorm1d's stayed: {'; '.join(moved)} (channel 0)")
        return 1
    if worst <= AGREES:
        print(f"no symptom (pass): every step's running statistics match nn.BatchNorm1d's (max rel err {worst:.2g})")
        return 0
    print(f"OTHER: the all-empty step leaves the running statistics, but a step is off by {worst:.3g} relative")
    return 2


if __name__ == "__main__":
    sys.exit(main())
