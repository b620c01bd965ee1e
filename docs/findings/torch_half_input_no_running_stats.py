#!/usr/bin/env python3
"""torch: SyncBatchNorm with track_running_stats=False refuses float16 input with float32 parameters:
"Expected counts to have type Half but got Float".

What it runs: 2 processes on CUDA (nccl with a GPU per rank, else gloo with both ranks on cuda:0) run
torch.nn.SyncBatchNorm(8, track_running_stats=False) with float32 parameters (as autocast leaves them) on
float16 input, 3 and 5 samples of 5x4, one training step (forward and backward). Expected: the output of
nn.BatchNorm2d(8, track_running_stats=False) over the whole batch in float64, which accepts the same layer
and input. Actual (torch 2.11.0+cu130, H200 and H100): every rank raises
RuntimeError: Expected counts to have type Half but got Float (in batch_norm_gather_stats_with_counts).

Cause: without a running_mean, the CUDA gather dispatches on the input's dtype and reads the counts as that
dtype (pytorch#50126); SyncBatchNorm.forward casts the counts only to running_mean.dtype (pytorch#98332), so
with no running statistics they stay float32. Severity: error, every training step. Reach: half or bfloat16
input with track_running_stats=False, uncommon; also activation checkpointing that turns the running
statistics off for a recomputed forward: fairscale met that interaction in 2021 (fairscale#617) and worked
around it on its side (fairscale#659, a force_input_to_fp32 flag); torch's layer was not changed.

A past version of this file (the harness's generated form) was run on an H100 (torch 2.11.0+cu130); no log of
that run was kept. This file exits 2 on CPU: torch's SyncBatchNorm runs only on CUDA.
Needs only torch and a GPU. Exit 1: the symptom shows (every rank raises RuntimeError with "Expected counts to
have type Half but got Float"); 0: every rank finishes and its output matches nn.BatchNorm2d's within the
tolerance; 2: anything else (no GPU, another error, a wrong value, a crash or a time-out).
"""
import datetime
import socket
import sys
import time
from multiprocessing.connection import wait

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD, C, SPATIAL, SIZES = 2, 8, (5, 4), (3, 5)
DTYPE, PARAM_DTYPE = torch.float16, torch.float32
SYMPTOM = "Expected counts to have type Half but got Float"
TOLERANCE = 16 * 2.0 ** -11  # relative to the largest output: 16 float16 roundoffs
GROUP_TIMEOUT_S, DEADLINE_S, EXIT_GRACE_S = 30, 90, 10


def step(rank):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(sum(SIZES), C, *SPATIAL, dtype=torch.float64, generator=g) * 1.5 + 0.5).to(DTYPE).double()
    dy = torch.randn(sum(SIZES), C, *SPATIAL, dtype=torch.float64, generator=g).to(DTYPE).double()
    bn = torch.nn.BatchNorm2d(C, track_running_stats=False).double().train()
    layer = torch.nn.SyncBatchNorm(C, track_running_stats=False).cuda().to(PARAM_DTYPE).train()
    return compare(rank, layer, bn, x, dy)


def compare(rank, layer, bn, x, dy):
    """One training step (forward, backward) of `layer` on this rank's part of the whole batch `x` (float64, on
    the CPU) and of `bn` (float64) on the whole batch; returns the output's max error relative to the largest
    reference value, and the number of non-finite values in the layer's and the reference's output."""
    part = slice(sum(SIZES[:rank]), sum(SIZES[:rank + 1]))
    xs = x.clone().requires_grad_()
    ys = bn(xs)
    ys.backward(dy)
    xr = x[part].to("cuda", DTYPE).requires_grad_()
    y = layer(xr)
    y.backward(dy[part].to("cuda", DTYPE))
    got, want = y.detach().double().cpu(), ys.detach()[part]
    scale = float(ys.detach().abs().max())
    err = float((got - want).abs().nan_to_num(float("inf")).max()) / scale if got.numel() else 0.0
    return err, int((~torch.isfinite(got)).sum()), int((~torch.isfinite(want)).sum())


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
    messages, codes, hung = launch(rank_main)
    ends = final(messages)
    for r, e in ends.items():
        print(f"rank {r} ({SIZES[r]} samples): {e}; exit {codes[r]}")
    if hung or not all(ends.values()):
        print(f"OTHER: not every rank reported: exit codes {codes}; killed at the deadline: {hung}")
        return 2
    if all(e[0] == "raised" and e[1] == "RuntimeError" and SYMPTOM in e[2] for e in ends.values()):
        print(f"SYMPTOM SHOWS (error): every rank raises RuntimeError: {SYMPTOM}; nn.BatchNorm2d runs")
        return 1
    if all(e[0] == "done" for e in ends.values()):
        worst = max(e[1][0] for e in ends.values())
        if worst <= TOLERANCE and not any(e[1][1] for e in ends.values()):
            print(f"no symptom (pass): every rank matches nn.BatchNorm2d over the whole batch "
                  f"(max rel err {worst:.3g} <= {TOLERANCE:.3g})")
            return 0
        print(f"OTHER: the step runs but the output is off: max rel err {worst:.3g} (tolerance {TOLERANCE:.3g})")
        return 2
    print(f"OTHER: {ends}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
