#!/usr/bin/env python3
"""torch: SyncBatchNorm with float16 input and an empty rank all_gathers a float16 row from the empty rank and a
float32 row from the others, and the collective then crashes, raises or hangs.

What it runs: 2 processes on CUDA (nccl with a GPU per rank, else gloo with both ranks on cuda:0) run
torch.nn.SyncBatchNorm(8) with float32 parameters (as autocast leaves them) on float16 input, rank 0 holding
0 samples and rank 1 holding 4 (spatial 5x4), one training step. The file wraps torch.distributed's
all_gather, all_gather_into_tensor and all_gather_single for the step (restored after it) so that each rank
reports the dtype and shape it passes before the collective runs. Expected: every rank passes the same
operand (float32[17]: the mean, invstd and count of 8 channels) and gets nn.BatchNorm2d's result over the 4
samples (float64, whole batch). Actual (torch 2.11.0+cu130 on an H200, gloo): rank 0 passes float16[17],
rank 1 float32[17]; gloo aborts a rank ("Received data size doesn't match expected size", 34 vs 17 bytes).
Over nccl the byte sizes differ too: a hang or garbage is likely; the file reports the mismatch either way.

Cause: the empty-input branch of torch/nn/modules/_functions.py allocates its zero row with dtype=input.dtype,
while non-empty ranks send batch_norm_stats' float32 statistics. Severity: crash (or hang). Reach: half or
bfloat16 input with float32 parameters and any rank whose batch is empty.

A past version of this file (the harness's generated form, which judged the crash alone) exited 1 on CUDA
(H200, torch 2.11.0+cu130, gloo, the 2026-11-28 suite). This file exits 2 on CPU: torch's SyncBatchNorm runs
only on CUDA.
Needs only torch and a GPU. Exit 1: the symptom shows (the ranks' gathered operands differ in dtype, whatever
the collective then does: crash, error, or a hang past the time limit, after which the ranks are killed);
0: every rank passes the same dtype, finishes, and matches nn.BatchNorm2d within the tolerance; 2: anything
else (no GPU, a rank failing before the gather, a mismatch of values with matching operands, ...).
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

WORLD, C, SPATIAL, SIZES = 2, 8, (5, 4), (0, 4)
DTYPE, PARAM_DTYPE = torch.float16, torch.float32
GROUP_TIMEOUT_S, DEADLINE_S, EXIT_GRACE_S = 30, 90, 10
GATHERS = ("all_gather", "all_gather_into_tensor", "all_gather_single")


def data():
    """Parameters and the whole batch (input, upstream gradient), drawn in float64 from a fixed seed."""
    g = torch.Generator().manual_seed(0)
    f64 = dict(dtype=torch.float64, generator=g)
    params = dict(weight=torch.rand(C, **f64) + 0.5, bias=torch.randn(C, **f64) * 0.5,
                  running_mean=torch.randn(C, **f64) * 0.1, running_var=torch.rand(C, **f64) + 0.5)
    x = (torch.randn(sum(SIZES), C, *SPATIAL, **f64) * 1.5 + 0.5).to(DTYPE).double()
    dy = torch.randn(sum(SIZES), C, *SPATIAL, **f64).to(DTYPE).double()
    return params, x, dy


def tolerance(x):
    """Relative to the largest reference value: 16 float16 roundoffs plus the float32 statistics' rounding."""
    cond = float((x.abs().amax((0, 2, 3)) / (x.var((0, 2, 3), correction=0) + 1e-5).sqrt()).max())
    return 16 * 2.0 ** -11 + 16 * 2.0 ** -24 * math.log2(x.numel() // C) * cond


def recording_gathers(conn):
    """Wrap torch.distributed's all_gather functions: each call first sends (name, dtype, shape) of the operand
    this rank passes; returns a function that restores them."""
    saved = {name: getattr(dist, name) for name in GATHERS if hasattr(dist, name)}

    def wrap(name, fn):
        def recorded(*args, **kwargs):
            operand = args[1] if len(args) > 1 else kwargs.get("tensor", kwargs.get("input_tensor"))
            conn.send(("gather", name, str(operand.dtype).replace("torch.", ""), list(operand.shape)))
            return fn(*args, **kwargs)
        return recorded

    for name, fn in saved.items():
        setattr(dist, name, wrap(name, fn))
    return lambda: [setattr(dist, name, fn) for name, fn in saved.items()]


def rank_main(rank, port, conn):
    """One training step on this rank's part of the batch; sends what it saw; never raises."""
    try:
        backend = "nccl" if torch.cuda.device_count() >= WORLD else "gloo"
        torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                                timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
        conn.send(("backend", backend))
        params, x, dy = data()
        bn = torch.nn.BatchNorm2d(C).double().train()  # the expectation: float64, over the whole batch
        bn.load_state_dict(params, strict=False)
        xs = x.clone().requires_grad_()
        ys = bn(xs)
        ys.backward(dy)
        layer = torch.nn.SyncBatchNorm(C).cuda().to(PARAM_DTYPE).train()
        layer.load_state_dict({k: v.to(PARAM_DTYPE) for k, v in params.items()}, strict=False)
        part = slice(sum(SIZES[:rank]), sum(SIZES[:rank + 1]))
        xr = x[part].to("cuda", DTYPE).requires_grad_()
        restore = recording_gathers(conn)
        try:
            y = layer(xr)
            y.backward(dy[part].to("cuda", DTYPE))
            torch.cuda.synchronize()
        finally:
            restore()
        got, want = y.detach().double().cpu().flatten(), ys.detach()[part].flatten()
        scale = float(ys.detach().abs().max())
        err = float((got - want).abs().max()) / scale if got.numel() else 0.0
        conn.send(("done", err, tolerance(x), int((~torch.isfinite(got)).sum())))
    except Exception as e:  # noqa: BLE001 - reported to the parent, which judges it
        conn.send(("raised", type(e).__name__, str(e).strip().splitlines()[0] if str(e).strip() else ""))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        conn.close()


def launch():
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
    hung = sorted(reading.values())  # still running at the deadline, report unfinished
    for r, p in enumerate(procs):
        p.join(timeout=0 if r in hung else EXIT_GRACE_S)
        if p.is_alive():
            p.kill()
            p.join(timeout=5)
    codes = {r: (f"signal {-p.exitcode}" if p.exitcode and p.exitcode < 0 else p.exitcode) for r, p in enumerate(procs)}
    return messages, codes, hung


def main():
    if not torch.cuda.is_available():
        print("OTHER: needs a GPU (torch's SyncBatchNorm runs only on CUDA)")
        return 2
    messages, codes, hung = launch()
    for r in range(WORLD):
        killed = ", killed at the deadline" if r in hung else ""
        print(f"rank {r} ({SIZES[r]} samples): {messages[r]}; exit {codes[r]}{killed}")
    first = {r: next((m for m in messages[r] if m[0] == "gather"), None) for r in range(WORLD)}
    ends = {r: next((m for m in messages[r] if m[0] in ("done", "raised")), None) for r in range(WORLD)}
    if all(first.values()):
        operands = {r: f"{m[2]}{m[3]}" for r, m in first.items()}
        dtypes = {m[2] for m in first.values()}
        if len(dtypes) > 1:
            raised = [f"rank {r} raised {e[1]}: {e[2]}" for r, e in ends.items() if e and e[0] == "raised"]
            died = [f"rank {r} died ({codes[r]})" for r in range(WORLD) if not ends[r] and r not in hung]
            kind = "hang" if hung else "crash" if died else "error" if raised else "completed"
            then = "; ".join(died + raised + ([f"ranks {hung} still waiting after {DEADLINE_S} s, killed"] if hung
                                              else []) or ["every rank finished"])
            print(f"SYMPTOM SHOWS ({kind}): the all_gather's operands differ: "
                  f"{', '.join(f'rank {r} {o}' for r, o in operands.items())}; then {then}")
            return 1
    done = [e for e in ends.values() if e and e[0] == "done"]
    if len(done) == WORLD and all(first.values()) and not hung:
        worst, tol = max(e[1] for e in done), min(e[2] for e in done)
        if worst <= tol and not any(e[3] for e in done):
            print(f"no symptom (pass): every rank passed {first[0][2]}{first[0][3]} to the all_gather and matches "
                  f"nn.BatchNorm2d over the whole batch (max rel err {worst:.3g} <= {tol:.3g})")
            return 0
        print(f"OTHER: the operands agree but the output does not: max rel err {worst:.3g} (tolerance {tol:.3g})")
        return 2
    print(f"OTHER: no comparable result: gathers {first}, ends {ends}, exit codes {codes}, hung {hung}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
