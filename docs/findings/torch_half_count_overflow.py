#!/usr/bin/env python3
"""torch: a fully float16 SyncBatchNorm with 65,520 or more values per channel on a rank gives NaN/Inf
everywhere.

What it runs: 2 processes on CUDA (nccl with a GPU per rank, else gloo with both ranks on cuda:0) run
torch.nn.SyncBatchNorm(1) converted whole to float16 (parameters and buffers, as model.half() does), rank 0
holding 1 sample and rank 1 holding 65,520, one training step (forward and backward). Expected: the output of
nn.BatchNorm1d(1) over the whole batch in float64 (finite). Actual (torch 2.11.0+cu130, H200 and H100): every
output value of every rank is NaN or Inf, and so are the gradients and running statistics.

Cause: SyncBatchNorm.forward casts the all_gathered counts to running_mean.dtype before
batch_norm_gather_stats_with_counts (pytorch#98332, for pytorch#96203); 65,520 rounds to inf in float16. The
same root cause as pytorch#70901 (counts merged in the running statistics' dtype). Severity: silent
non-finite. Reach: fully half models (not autocast) with 65,520+ values per channel on a rank: a ResNet stem at
224x224 from 6 samples per GPU.

A past version of this file (the harness's generated form) was run on an H100 (torch 2.11.0+cu130); no log of
that run was kept. This file exits 2 on CPU: torch's SyncBatchNorm runs only on CUDA.
Needs only torch and a GPU. Exit 1: the symptom shows (a rank's output holds NaN/Inf where nn.BatchNorm1d's
is finite); 0: every rank's output is finite and matches nn.BatchNorm1d's within the tolerance; 2: anything
else (no GPU, an error, finite but wrong values, a crash or a time-out).
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

WORLD, C, SIZES = 2, 1, (1, 65520)
DTYPE = PARAM_DTYPE = torch.float16
GROUP_TIMEOUT_S, DEADLINE_S, EXIT_GRACE_S = 30, 120, 10


def tolerance(x):
    """Relative to the largest reference value: 16 float16 roundoffs, plus 16 float32 roundoffs of the statistics
    x log2(values per channel) x the batch's max|x| / std."""
    cond = float((x.abs().amax(0) / (x.var(0, correction=0) + 1e-5).sqrt()).max())
    return 16 * 2.0 ** -11 + 16 * 2.0 ** -24 * math.log2(x.numel() // C) * cond


def step(rank):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(sum(SIZES), C, dtype=torch.float64, generator=g) * 1.5 + 0.5).to(DTYPE).double()
    dy = torch.randn(sum(SIZES), C, dtype=torch.float64, generator=g).to(DTYPE).double()
    bn = torch.nn.BatchNorm1d(C).double().train()
    layer = torch.nn.SyncBatchNorm(C).cuda().to(PARAM_DTYPE).train()
    return (*compare(rank, layer, bn, x, dy), tolerance(x))


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
    if hung or not all(e and e[0] == "done" for e in ends.values()):
        print(f"OTHER: not every rank finished: {ends}; exit codes {codes}; killed at the deadline: {hung}")
        return 2
    results = {r: e[1] for r, e in ends.items()}  # (max rel err, non-finite in output, in reference, tolerance)
    if any(res[2] for res in results.values()):
        print("OTHER: nn.BatchNorm1d's own output is not finite here")
        return 2
    bad = {r: res[1] for r, res in results.items() if res[1]}
    if bad:
        print(f"SYMPTOM SHOWS (non-finite): NaN/Inf output where nn.BatchNorm1d's is finite: "
              f"{', '.join(f'rank {r} {n} of {SIZES[r]} values' for r, n in bad.items())}")
        return 1
    worst, tol = max(res[0] for res in results.values()), min(res[3] for res in results.values())
    if worst <= tol:
        print(f"no symptom (pass): every rank's output is finite and matches nn.BatchNorm1d over the whole batch "
              f"(max rel err {worst:.3g} <= {tol:.3g})")
        return 0
    print(f"OTHER: the output is finite but off nn.BatchNorm1d's: max rel err {worst:.3g} (tolerance {tol:.3g})")
    return 2


if __name__ == "__main__":
    sys.exit(main())
