#!/usr/bin/env python3
"""torch: SyncBatchNorm refuses float32 input when its running statistics are float64 and it has no
weights, although nn.BatchNorm2d on CUDA accepts the same layer.

What it runs: a layer built with affine=False and converted with .double() (float64 running_mean and
running_var, no weight or bias) is fed float32 activations: 2 processes on CUDA (nccl with a GPU per rank,
else gloo with both ranks on cuda:0), 3 channels, 4 samples of 5x5 each, one training forward. Expected:
nn.BatchNorm2d built the same way trains on the whole batch on CUDA (ATen's native kernel updates float64
running statistics from float32 input), and SyncBatchNorm should give its output. Actual (torch
2.11.0+cu130, H200): every rank raises RuntimeError: Expected mean to have type Double but got Float, in
batch_norm_gather_stats_with_counts, whose CUDA dispatch follows the running statistics' dtype; SyncBatchNorm
casts only the counts to that dtype (pytorch#98332), not the gathered means.

Severity: error. Reach: rare (affine=False layers converted with .double() and fed float32).

A past version of this file (the same check, its ranks' results passed through a queue) exited 1 on CUDA
(H200, torch 2.11.0+cu130, gloo, the 2026-11-28 suite). This file exits 2 on CPU: torch's SyncBatchNorm runs
only on CUDA.
Needs only torch and a GPU. Exit 1: the symptom shows (nn.BatchNorm2d runs and every rank raises
RuntimeError with "Expected mean to have type Double but got Float"); 0: every rank runs and its output
matches nn.BatchNorm2d's over the whole batch within 1e-5 relative; 2: anything else (no GPU, nn.BatchNorm2d
refusing too, another error, a wrong value, a crash or a time-out).
"""
import datetime
import socket
import sys
import time
from multiprocessing.connection import wait

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD, C, N, HW = 2, 3, 4, (5, 5)
SYMPTOM = "Expected mean to have type Double but got Float"
TOLERANCE = 1e-5  # relative to the largest output; float32 input
GROUP_TIMEOUT_S, DEADLINE_S, EXIT_GRACE_S = 30, 90, 10


def layer(cls):
    return cls(C, affine=False).cuda().double().train()  # float64 running statistics, no weight or bias


def batch():
    return torch.randn(WORLD * N, C, *HW, generator=torch.Generator().manual_seed(0))  # float32


def step(rank):
    """This rank's output, as a list."""
    return layer(torch.nn.SyncBatchNorm)(batch()[rank * N:(rank + 1) * N].cuda()).detach().double().cpu().tolist()


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
        whole = layer(torch.nn.BatchNorm2d)(batch().cuda()).detach().double().cpu()  # nn.BatchNorm, whole batch
    except RuntimeError as e:
        print(f"OTHER: nn.BatchNorm2d refuses it too, so SyncBatchNorm's refusal is no defect: {e}")
        return 2
    print(f"expected: nn.BatchNorm2d (float64 running statistics, no weights) runs on float32 input, "
          f"output {whole.dtype}")
    messages, codes, hung = launch(rank_main)
    ends = final(messages)
    for r, e in ends.items():
        print(f"rank {r}: {e if not e or e[0] == 'raised' else ('done', '...')}; exit {codes[r]}")
    if hung or not all(ends.values()):
        print(f"OTHER: not every rank reported: exit codes {codes}; killed at the deadline: {hung}")
        return 2
    if all(e[0] == "raised" and e[1] == "RuntimeError" and SYMPTOM in e[2] for e in ends.values()):
        print(f"SYMPTOM SHOWS (error): every rank raises RuntimeError: {SYMPTOM}; nn.BatchNorm2d accepts the "
              f"same layer and input")
        return 1
    if all(e[0] == "done" for e in ends.values()):
        y = torch.cat([torch.tensor(ends[r][1], dtype=torch.float64) for r in range(WORLD)])
        err = float((y - whole).abs().max() / whole.abs().max())
        if err <= TOLERANCE:
            print(f"no symptom (pass): SyncBatchNorm runs and matches nn.BatchNorm2d (max rel err {err:.3g})")
            return 0
        print(f"OTHER: SyncBatchNorm runs but is off nn.BatchNorm2d by {err:.3g} relative")
        return 2
    print(f"OTHER: {ends}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
