#!/usr/bin/env python3
"""torch: a training step in which every rank is empty moves SyncBatchNorm's running statistics.

2 processes run torch.nn.SyncBatchNorm (5 channels, float32) through three training steps; in the
second, every rank's batch is empty. torch.nn.BatchNorm1d over the same whole batch (float64) counts
that step and leaves running_mean and running_var as they were; SyncBatchNorm shrinks both by
(1 - momentum), as pytorch#36530 asked it not to.

Seen on CUDA (this file exits 1 on an NVIDIA H200 with torch 2.11.0+cu130) and in cpu-emulation with
syncbn-harness (case degenerate/all-empty-step/float32-float32/momentum-0.1/ws2, torch 2.13.0). Needs only torch. Exit 1: the symptom shows; 0: it does not (fixed);
2: something else failed. Without a GPU, torch's SyncBatchNorm runs over plain-torch CPU stand-ins for its
five CUDA ops (stand_in_cuda_ops below): a symptom seen that way lives in torch's Python code.
"""
import datetime
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD, C = 2, 5
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BACKEND = "nccl" if DEVICE == "cuda" and torch.cuda.device_count() >= WORLD else "gloo"


def stand_in_cuda_ops():
    """No GPU: plain-torch CPU stand-ins for the five CUDA-only ops torch's SyncBatchNorm calls (statistics
    in float32, float64 for float64 input, and the gather's dtype checks, as CUDA has them), and its device
    check told "cpu" is an accelerator. What runs is torch's own Python code (nn.SyncBatchNorm,
    torch/nn/modules/_functions.py) over these."""
    acc = lambda t: torch.float64 if t == torch.float64 else torch.float32  # noqa: E731
    d, c = lambda t: [0, *range(2, t.dim())], lambda v, t: v.view(1, -1, *[1] * (t.dim() - 2))  # noqa: E731
    c10 = {torch.float64: "Double", torch.float32: "Float", torch.float16: "Half", torch.bfloat16: "BFloat16"}

    def stats(x, eps):
        var, mean = torch.var_mean(x.to(acc(x.dtype)), d(x), correction=0)
        return mean, (var + eps).rsqrt()

    def gather_stats_with_counts(x, mean, invstd, rm, rv, momentum, eps, counts):
        t = x.dtype if rm is None else rm.dtype  # CUDA dispatches on it and reads the counts as it
        for name, v, want in (("mean", mean, acc(t)), ("invstd", invstd, acc(t)), ("counts", counts, t)):
            if v.dtype != want:
                raise RuntimeError(f"Expected {name} to have type {c10[want]} but got {c10[v.dtype]}")
        m, var_n, n = mean.new_zeros(C), mean.new_zeros(C), 0.0  # merged rank by rank, as CUDA
        for j, cnt in enumerate(counts):  # does, n + count in the counts' dtype (float16: inf past 65,504)
            f = (torch.tensor(n, dtype=counts.dtype) + cnt).to(mean.dtype).reciprocal()
            var_n = var_n + (invstd[j] ** -2 - eps + (m - mean[j]) ** 2 * n * f) * float(cnt)
            m, n = n * f * m + float(cnt) * f * mean[j], n + float(cnt)
        var = var_n / n
        if rm is not None:
            rm.mul_(1 - momentum).add_((m * momentum).to(rm.dtype))
            rv.mul_(1 - momentum).add_((var_n / (n - 1) * momentum).to(rv.dtype))
        return m, (var + eps).rsqrt()

    def elemt(x, w, b, mean, invstd, eps):
        y = (x.to(mean.dtype) - c(mean, x)) * c(invstd, x)
        return (y if w is None else y * c(w.to(mean.dtype), x) + c(b.to(mean.dtype), x)).to(x.dtype)

    def backward_reduce(dy, x, mean, invstd, w, input_g, weight_g, bias_g):
        dy, xmu = dy.to(mean.dtype), x.to(mean.dtype) - c(mean, x)
        s, sx = dy.sum(d(x)), (dy * xmu).sum(d(x))
        return s, sx, (sx * invstd).to(w.dtype) if weight_g else None, s.to(w.dtype) if bias_g else None

    def backward_elemt(dy, x, mean, invstd, w, s, sx, count):
        n, k = count.sum().to(mean.dtype), invstd if w is None else invstd * w.to(mean.dtype)
        xmu = x.to(mean.dtype) - c(mean, x)
        return ((dy.to(mean.dtype) - c(s / n, x) - xmu * c(invstd**2 * sx / n, x)) * c(k, x)).to(dy.dtype)

    stand_in_cuda_ops.lib = torch.library.Library("aten", "IMPL")  # kept: the registrations live with it
    for fn in (stats, gather_stats_with_counts, elemt, backward_reduce, backward_elemt):
        stand_in_cuda_ops.lib.impl(f"batch_norm_{fn.__name__}", fn, "CPU")
    torch._C._get_privateuse1_backend_name = lambda: "cpu"


def setup(rank, port):
    if DEVICE == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    else:
        stand_in_cuda_ops()
    dist.init_process_group(BACKEND, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))


def rank_main(rank, port):
    """Three training steps (per-rank batch sizes 3/2, 0/0, 2/3) beside BatchNorm1d on the whole batch."""
    setup(rank, port)
    g = torch.Generator().manual_seed(0)
    layer = torch.nn.SyncBatchNorm(C).to(DEVICE)
    bn = torch.nn.BatchNorm1d(C).double()
    agrees = True
    for step, sizes in enumerate([(3, 2), (0, 0), (2, 3)]):
        xs = [torch.randn(n, C, 4, generator=g) * 2 + 1 for n in sizes]
        bn(torch.cat(xs).double()).sum().backward()
        layer(xs[rank].to(DEVICE).requires_grad_()).sum().backward()
        for name in ("running_mean", "running_var"):
            got, want = getattr(layer, name).double().cpu(), getattr(bn, name)
            err = float((got - want).abs().max())
            print(f"rank {rank} step {step} {name}: expected {want[0]:.6g}, actual {got[0]:.6g} (channel 0)")
            agrees &= err <= 1e-5 * float(want.abs().max())
    dist.destroy_process_group()
    sys.exit(0 if agrees else 1)


def main():
    """Spawn the ranks; exit 1 if the symptom shows on any rank, 0 if not, 2 if something else failed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        mp.spawn(rank_main, (port,), nprocs=WORLD)
    except mp.ProcessExitedException as e:
        print("SYMPTOM SHOWS" if e.exit_code == 1 else f"OTHER: {e}")
        return 1 if e.exit_code == 1 else 2
    except mp.ProcessRaisedException as e:
        print(f"OTHER: {e}")
        return 2
    print("no symptom: SyncBatchNorm agrees with torch.nn.BatchNorm over the whole batch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
