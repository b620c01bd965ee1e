#!/usr/bin/env python3
"""torch: SyncBatchNorm refuses float32 input when its running statistics are float64 and it has no
weights, although nn.BatchNorm on CUDA accepts the same layer.

A layer built with affine=False and then converted with .double() (float64 running_mean and
running_var, no weight or bias) is fed float32 activations. nn.BatchNorm2d on CUDA trains on them
(ATen's native kernel updates float64 running statistics from float32 input). SyncBatchNorm, in a
synchronized training step, raises in batch_norm_gather_stats_with_counts: its CUDA dispatch follows
the running statistics' dtype and refuses the float32 means ("Expected mean to have type Double but
got Float").

Two processes on one or two GPUs (nccl with two GPUs, else gloo over CUDA tensors), 3 channels,
4 samples of 5x5 each. Needs only torch and a GPU. Exit 1: the symptom shows (SyncBatchNorm raises
where nn.BatchNorm2d over the whole batch runs); 0: it does not (fixed: SyncBatchNorm's output then
matches nn.BatchNorm2d's); 2: something else failed.
"""
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD, C, N, HW = 2, 3, 4, (5, 5)


def layer(cls):
    return cls(C, affine=False).cuda().double()  # float64 running statistics, no weight or bias


def batch():
    g = torch.Generator().manual_seed(0)
    return torch.randn(WORLD * N, C, *HW, generator=g)  # float32


def worker(rank, port, results):
    backend = "nccl" if torch.cuda.device_count() >= WORLD else "gloo"
    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        x = batch()[rank * N:(rank + 1) * N].cuda()
        try:
            y = layer(torch.nn.SyncBatchNorm).train()(x)
            results.put((rank, None, y.cpu()))
        except RuntimeError as e:
            results.put((rank, str(e).splitlines()[0], None))
    finally:
        dist.destroy_process_group()


def main():
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    try:
        whole = layer(torch.nn.BatchNorm2d).train()(batch().cuda()).cpu()  # nn.BatchNorm over the whole batch
    except RuntimeError as e:
        print(f"nn.BatchNorm2d refuses it too, so SyncBatchNorm's refusal is no defect: {e}")
        return 2
    print(f"nn.BatchNorm2d (float64 running stats, no weights) on float32 input: runs, output {whole.dtype}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, port, results)) for r in range(WORLD)]
    for p in procs:
        p.start()
    got = dict((r, (err, y)) for r, err, y in (results.get(timeout=120) for _ in procs))
    for p in procs:
        p.join(timeout=30)
    errors = {r: err for r, (err, _) in got.items() if err}
    if errors:
        for r, err in sorted(errors.items()):
            print(f"rank {r}: SyncBatchNorm raises RuntimeError: {err}")
        print("SYMPTOM SHOWS: SyncBatchNorm refuses a layer and input that nn.BatchNorm2d accepts")
        return 1
    y = torch.cat([got[r][1] for r in range(WORLD)])
    err = (y.double() - whole.double()).abs().max().item()
    print(f"SyncBatchNorm runs; max difference from nn.BatchNorm2d over the whole batch {err:.3g}")
    return 0 if err < 1e-4 else 2


if __name__ == "__main__":
    sys.exit(main())
