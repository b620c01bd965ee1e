#!/usr/bin/env python3
"""apex's optimized SyncBatchNorm gives NaN on every rank when one rank's 2-D batch is empty.

Two processes (nccl with a GPU each, else gloo with CUDA tensors on shared GPUs) run
apex.parallel.SyncBatchNorm(1, affine=False), built with its syncbn CUDA extension, in one training forward
on (N, 1) inputs: rank 0 holds no sample, rank 1 two. torch.nn.BatchNorm1d over the whole batch (the two
samples, float64) is what rank 1's output should be. apex runs 2-D input through its channel-last kernels,
where the empty rank's biased variance is 0/0 = NaN (csrc/welford.cu, welford_kernel_c_last), and the merge
weights it by its count of 0, which leaves NaN (welford_kernel_parallel): the global variance is NaN.

Every wait is bounded: the process group's timeout is 60 s, the whole run 120 s (10 s more for the other rank
once one has failed); ranks still running then are terminated, then killed, and all are reaped.

Seen: apex e13873de with its syncbn extension, torch 2.11.0+cu130, H200, gloo. Needs torch, apex built with
its syncbn extension, and a GPU. Exit 1: the symptom (a non-finite output of rank 1) shows; 0: it does not
(rank 1's output within 1e-5 of BatchNorm1d's); 2: something else failed (reason printed).
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
    from apex.parallel import SyncBatchNorm
except ImportError as exc:  # reported by main, exit 2
    SyncBatchNorm, IMPORT_ERROR = None, f"{type(exc).__name__}: {exc}"

SIZES = (0, 2)
TOL = 1e-5  # agreement: absolute, on outputs of size 1
TIMEOUT_S, GRACE_S, DEVICE = 120, 10, "cuda"  # the whole run (the process group's timeout is half of it); the
# time the other ranks get once one has raised or died; the device


def rank_main(rank, world):
    """apex's layer on this rank's part, BatchNorm1d on the whole batch: this rank's output and the expected."""
    x = torch.tensor([[0.5], [2.0]], dtype=torch.float64)  # the whole batch: rank 1's two samples
    start = sum(SIZES[:rank])
    part = x[start:start + SIZES[rank]]
    y = SyncBatchNorm(1, affine=False).cuda()(part.float().cuda())
    want = torch.nn.BatchNorm1d(1, affine=False).double()(x)[start:start + SIZES[rank]]
    return dict(y=y.double().cpu().flatten().tolist(), want=want.flatten().tolist())


def judge(got):
    """(exit code, verdict line) from every rank's outcome."""
    values = {r: v for r, (kind, v) in sorted(got.items()) if kind == "value"}
    for r, v in values.items():
        if v["y"] and not all(map(math.isfinite, v["y"])):
            return 1, f"SYMPTOM SHOWS (mismatch): rank {r} output {v['y']}, expected {v['want']}"
    failed = [f"rank {r}: {kind} ({one_line(what)})" for r, (kind, what) in sorted(got.items()) if kind != "value"]
    if failed:
        return 2, f"OTHER: {'; '.join(failed)}"
    for r, v in values.items():
        if len(v["y"]) != len(v["want"]) or any(abs(a - b) > TOL for a, b in zip(v["y"], v["want"])):
            return 2, f"OTHER: rank {r} output {v['y']}, expected {v['want']}"
    return 0, (f"no symptom (pass): rank 1's output {values[1]['y']} matches BatchNorm1d over the whole batch "
               f"({values[1]['want']}) within {TOL}")


def _rank(fn, rank, world, port, results):
    """One process: join the group, run fn, put (rank, ("value", v) or ("raised", what)) on the queue."""
    try:
        backend = "gloo"
        if DEVICE == "cuda":
            torch.cuda.set_device(rank % torch.cuda.device_count())
            backend = "nccl" if torch.cuda.device_count() >= world else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=TIMEOUT_S // 2))
        out = ("value", fn(rank, world))
    except Exception as exc:  # reported to the parent, which judges it
        out = ("raised", f"{type(exc).__name__}: {exc}")
    results.put((rank, out))
    if dist.is_initialized():
        dist.destroy_process_group()


def _signal_name(number):
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal number {number}"


def run_ranks(fn, world):
    """fn(rank, world) in `world` processes: {rank: ("value", v) | ("raised", what) | ("died", how) |
    ("stopped", why)}. Every wait is bounded: the whole run by TIMEOUT_S, and once a rank has raised or died the
    others get GRACE_S more to report theirs; a process still running at its deadline is terminated, then
    killed ("stopped"); all are reaped. A rank killed by a signal died "signal <name>"."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(fn, r, world, port, results)) for r in range(world)]
    got, deadline, why, stopped = {}, time.monotonic() + TIMEOUT_S, f"still running after {TIMEOUT_S} s", {}
    try:
        for p in procs:
            p.start()
        while len(got) < world and time.monotonic() < deadline:
            try:
                rank, out = results.get(timeout=0.5)
                got[rank] = out
            except queue.Empty:
                ended = [r for r, p in enumerate(procs) if r not in got and p.exitcode is not None]
                if ended:  # a result put just before the exit is read first
                    time.sleep(0.5)
                    while True:
                        try:
                            rank, out = results.get(timeout=0.1)
                            got[rank] = out
                        except queue.Empty:
                            break
                    for r in ended:
                        code = procs[r].exitcode
                        how = f"exit code {code}" if code >= 0 else f"signal {_signal_name(-code)}"
                        got.setdefault(r, ("died", how))
            failed = [r for r, (kind, _) in got.items() if kind != "value"]
            if failed and time.monotonic() + GRACE_S < deadline:
                deadline = time.monotonic() + GRACE_S
                why = f"still running {GRACE_S} s after rank {failed[0]} failed"
    finally:
        for r, p in enumerate(procs):
            if p.pid is None:  # never started
                continue
            p.join(timeout=max(0.0, min(5.0, deadline - time.monotonic())))
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
                stopped[r] = "terminated"
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
                stopped[r] = "killed" if not p.is_alive() else "still alive after SIGKILL"
        results.close()
    for r in range(world):
        got.setdefault(r, ("stopped", f"{why} ({stopped.get(r, 'ended by itself at the deadline')})"))
    return got


def one_line(text, limit=400):
    """A rank's report on one line (the verdict is one line), in ASCII, cut at `limit` characters."""
    text = " ".join(str(text).split()).encode("ascii", "backslashreplace").decode("ascii")
    return text if len(text) <= limit else text[:limit] + " ..."


def main():
    if SyncBatchNorm is None:
        print(f"OTHER: needs apex ({IMPORT_ERROR})")
        return 2
    if not torch.cuda.is_available():
        print("OTHER: needs a GPU (apex's optimized SyncBatchNorm runs CUDA kernels)")
        return 2
    if SyncBatchNorm.__module__ != "apex.parallel.optimized_sync_batchnorm":
        print(f"OTHER: needs apex built with its syncbn CUDA extension (got {SyncBatchNorm.__module__})")
        return 2
    code, line = judge(run_ranks(rank_main, len(SIZES)))
    print(line)
    return code


if __name__ == "__main__":
    try:
        CODE = main()
    except Exception as exc:  # the run itself failed: not the symptom
        print(f"OTHER: {one_line(f'{type(exc).__name__}: {exc}')}")
        CODE = 2
    sys.exit(CODE)
