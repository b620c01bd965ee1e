#!/usr/bin/env python3
"""apex's optimized SyncBatchNorm gives NaN on every rank when one rank's 2-D batch is empty.

Two processes (nccl with a GPU each, else gloo with CUDA tensors on shared GPUs) run
apex.parallel.SyncBatchNorm(1, affine=False), built with its syncbn CUDA extension, in one training forward
on (N, 1) inputs: rank 0 holds no sample, rank 1 two. torch.nn.BatchNorm1d over the whole batch (the two
samples, float64) is what rank 1's output should be. apex runs 2-D input through its channel-last kernels,
where the empty rank's biased variance is 0/0 = NaN (csrc/welford.cu, welford_kernel_c_last), and the merge
weights it by its count of 0, which leaves NaN (welford_kernel_parallel): the global variance is NaN.

Seen: apex e13873de with its syncbn extension, torch 2.11.0+cu130, H200, gloo. Needs torch, apex built with
its syncbn extension, and a GPU. Exit 1: the symptom shows; 0: it does not (fixed); 2: something else failed.
"""
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
try:
    from apex.parallel import SyncBatchNorm
except ImportError as exc:  # reported by main, exit 2
    SyncBatchNorm, IMPORT_ERROR = None, f"{type(exc).__name__}: {exc}"

SIZES = (0, 2)


def rank_main(rank, port):
    torch.cuda.set_device(rank % torch.cuda.device_count())
    backend = "nccl" if torch.cuda.device_count() >= len(SIZES) else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=len(SIZES))
    x = torch.tensor([[0.5], [2.0]], dtype=torch.float64)  # the whole batch: rank 1's two samples
    start = sum(SIZES[:rank])
    part = x[start:start + SIZES[rank]]
    y = SyncBatchNorm(1, affine=False).cuda()(part.float().cuda())
    want = torch.nn.BatchNorm1d(1, affine=False).double()(x)[start:start + SIZES[rank]]
    dist.destroy_process_group()
    if part.numel():
        got = y.double().cpu()
        if not torch.isfinite(got).all():
            raise RuntimeError(f"SYMPTOM rank {rank} output {got.flatten().tolist()}, expected "
                             f"{want.flatten().tolist()}")
        if (got - want).abs().max() > 1e-5:
            raise RuntimeError(f"OTHER rank {rank} output {got.flatten().tolist()}, expected {want.flatten().tolist()}")


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
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        mp.spawn(rank_main, args=(port,), nprocs=len(SIZES))
    except mp.ProcessRaisedException as exc:
        last = str(exc).strip().splitlines()[-1]
        shows = "SYMPTOM" in last
        print(f"{'SYMPTOM SHOWS (mismatch)' if shows else 'OTHER'}: {last}")
        return 1 if shows else 2
    except mp.ProcessExitedException as exc:
        print(f"OTHER: {exc}")
        return 2
    print("no symptom: rank 1's output matches BatchNorm1d over the whole batch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
