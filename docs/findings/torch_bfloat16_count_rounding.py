#!/usr/bin/env python3
"""torch: a fully bfloat16 SyncBatchNorm merges the ranks' statistics with counts rounded to bfloat16.

Two processes hold 450 and 232 samples of one batch (3 channels, values about 100 +- 1) and run
torch.nn.SyncBatchNorm converted whole to bfloat16 (model.to(torch.bfloat16)). torch casts the gathered
counts to the running statistics' dtype (pytorch#98332), and CUDA's batch_norm_gather_stats_with_counts
forms each partial sum n + count in that dtype: 450 + 232 = 682 is not a bfloat16 number and becomes 680,
so the merged mean is weighted by 682/680 and lands 0.4 % high. The output is then off by the mean's error
over the spread (about 0.27 here), against nn.BatchNorm1d over the whole batch in float64. The float16 form
is pytorch#70901; its fix (pytorch#71050, float32 counts) was closed unmerged.

Needs only torch and a GPU (nccl with two GPUs, else gloo over CUDA tensors). Exit 1: the symptom shows;
0: it does not (fixed); 2: something else failed.
"""
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES, C = (450, 232), 3
TOLERANCE = 0.05  # bfloat16 rounds an output near 2 by 0.008 at most


def batch():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(sum(SIZES), C, generator=g, dtype=torch.float64) + 100).to(torch.bfloat16)


def worker(rank, port, results):
    world = len(SIZES)
    backend = "nccl" if torch.cuda.device_count() >= world else "gloo"
    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        start = sum(SIZES[:rank])
        x = batch()[start:start + SIZES[rank]].cuda()
        layer = torch.nn.SyncBatchNorm(C).cuda().to(torch.bfloat16).train()
        results.put((rank, layer(x).detach().double().cpu()))
    finally:
        dist.destroy_process_group()


def main():
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    print(f"{SIZES[0]} + {SIZES[1]} in bfloat16: {torch.tensor(float(sum(SIZES)), dtype=torch.bfloat16).item():g}")
    whole = torch.nn.BatchNorm1d(C).double().train()(batch().double()).detach()  # nn.BatchNorm, whole batch
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, port, results)) for r in range(len(SIZES))]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    y = torch.cat([got[r] for r in range(len(SIZES))])
    err = (y - whole).abs().max().item()
    print(f"SyncBatchNorm output against nn.BatchNorm1d over the whole batch (float64): max error {err:.3f}")
    if err > TOLERANCE:
        print(f"SYMPTOM SHOWS: the output is off by {err:.3f} (> {TOLERANCE}), bfloat16's rounding allows 0.008")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
