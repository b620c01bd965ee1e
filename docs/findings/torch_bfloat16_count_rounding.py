#!/usr/bin/env python3
"""torch: a fully bfloat16 SyncBatchNorm merges the ranks' statistics with bfloat16 counts.

2 processes run torch.nn.SyncBatchNorm (3 channels, bfloat16 input and parameters, inputs about 100 +- 1)
on 450 and 232 samples and compare the output with torch.nn.BatchNorm1d over the whole batch in float64.
torch casts the gathered counts to bfloat16 (pytorch#98332) and CUDA's batch_norm_gather_stats_with_counts
forms n + count in bfloat16: 450 + 232 = 682 becomes 680, so the mean is weighted by 682/680 and the output
is 0.27 off. The float16 form is pytorch#70901; its fix (pytorch#71050, float32 counts) was closed unmerged.

Seen on CUDA (H200, torch 2.11.0+cu130) by syncbn-harness's search, and this file (its case ws2-2b76e536)
exits 1 there; without a GPU it runs over CPU stand-ins for SyncBatchNorm's five CUDA ops that merge as CUDA does.
Needs only torch. Exit 1: the symptom shows; 0: it does not (fixed); 2: something else failed.
"""
import datetime
import math
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SyncBatchNorm = torch.nn.SyncBatchNorm
C, SPATIAL = 3, [(), ()]  # channels; each rank's spatial size
STEP_SIZES = [[450, 232]]  # each step's batch size per rank
STEPS = ['train']  # train, eval: forward and backward; nograd: training forward, no_grad
DTYPE, PARAM_DTYPE = torch.bfloat16, torch.bfloat16  # input; parameters and buffers
LAYER = dict(eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)
INPUT_MEAN, INPUT_SCALE, CONSTANT_CHANNELS = 100.0, 1.0, []
SEED = 0
SYMPTOM, QUANTITY, ERROR_TYPE = 'mismatch', 'output', None  # what shows the defect
# Tolerance: 16 unit roundoffs of the quantity's dtype, plus 16 of the accumulation type (float32;
# float64 for float64 input) x log2(values per channel) x the input's max|x| / sqrt(var + eps)
U_Q, U_ACC = 0.00390625, 5.960464477539063e-08
BN = torch.nn.BatchNorm1d
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BACKEND = "nccl" if DEVICE == "cuda" and torch.cuda.device_count() >= len(SPATIAL) else "gloo"


def data():
    """The parameters and each step's per-rank (input, upstream gradient), made in float64
    from SEED's standard normals, the samples' drawn in float32."""
    g = torch.Generator().manual_seed(SEED)
    f64 = dict(dtype=torch.float64, generator=g)
    off, scale = torch.randn(C, **f64), torch.rand(C, **f64) * 1.5 + 0.5
    sign = torch.where(torch.rand(C, generator=g) < 0.3, -1.0, 1.0).double()
    params = dict(weight=sign * (torch.rand(C, **f64) * 1.5 + 0.25), bias=torch.randn(C, **f64) * 0.5,
                  running_mean=torch.randn(C, **f64) * 0.1, running_var=torch.rand(C, **f64) * 0.5 + 0.75)
    steps = []
    for sizes in STEP_SIZES:
        steps.append([])
        for n, sp in zip(sizes, SPATIAL):
            shape, b = (n, C, *sp), (1, C) + (1,) * len(sp)
            x = torch.randn(shape, dtype=torch.float32, generator=g).double() * scale.view(b) + off.view(b)
            x = x * INPUT_SCALE + INPUT_MEAN
            for c in CONSTANT_CHANNELS:
                x[:, c] = INPUT_MEAN + INPUT_SCALE * off[c]
            steps[-1].append((x.to(DTYPE).double(), torch.randn(shape, dtype=torch.float32, generator=g).to(DTYPE).double()))
    return {k: v.to(PARAM_DTYPE) for k, v in params.items()}, steps


def tolerance(x):  # normwise, relative; x: the whole batch, whose max|x| / sqrt(var + eps) is its conditioning
    dims, k, x = [0, *range(2, x.dim())], x.numel() // C, x.detach()
    cond = float((x.abs().amax(dims) / (x.var(dims, correction=0) + LAYER["eps"]).sqrt()).max()) if k else 1.0
    return 16 * U_Q + 16 * U_ACC * max(math.log2(max(k, 1)), 1) * cond


def observe(module, y, grad, group=False):  # QUANTITY after a step
    return y.detach()


def check(rank, s, kind, got, want, tol):
    """Compare one step's QUANTITY with BatchNorm's; print expected against actual; True if they agree."""
    got, want = got.detach().double().cpu().flatten(), want.detach().flatten()
    if want.numel() == 0:
        return True  # this rank's part of the batch is empty
    i = int((got - want).abs().nan_to_num(math.inf).argmax())
    rel = float((got - want).abs().max() / want.abs().max().clamp_min(1e-300))
    print(f"rank {rank} step {s} ({kind}) {QUANTITY}: expected {float(want[i]):.6g}, actual {float(got[i]):.6g} "
          f"(element {i}); max rel err {rel:.3g} {'<=' if rel <= tol else '>'} tol {tol:.3g}\n", end="")
    return rel <= tol


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
        m, var_n, n = torch.zeros_like(mean[0]), torch.zeros_like(mean[0]), 0.0  # merged rank by rank, as CUDA
        for j, cnt in enumerate(counts):  # does, n + count in the counts' dtype (float16: inf past 65,504)
            f = (torch.tensor(n, dtype=counts.dtype) + cnt).to(mean.dtype).reciprocal()
            var_n = var_n + (invstd[j] ** -2 - eps + (m - mean[j]) ** 2 * n * f) * float(cnt)
            m, n = n * f * m + float(cnt) * f * mean[j], n + float(cnt)
        var = var_n / n
        if rm is not None:
            rm.mul_(1 - momentum).add_((m * momentum).to(rm.dtype))
            rv.mul_(1 - momentum).add_((var * n / (n - 1) * momentum).to(rv.dtype))
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


def rank_main(rank, port):
    """The layer on this rank's part of each step's batch, beside BatchNorm on the whole batch."""
    if DEVICE == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    else:
        stand_in_cuda_ops()
    dist.init_process_group(BACKEND, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=len(SPATIAL),
                            timeout=datetime.timedelta(seconds=60))
    members, group = list(range(len(SPATIAL))), None
    params, steps = data()
    layer = SyncBatchNorm(C, **LAYER, process_group=group).to(DEVICE, PARAM_DTYPE)
    bn = BN(C, **LAYER).double()  # the expectation: float64, over the whole batch of the group
    layer.load_state_dict(params, strict=False)
    bn.load_state_dict({k: v.double() for k, v in params.items()}, strict=False)
    agrees = True
    for s, (kind, sizes, row) in enumerate(zip(STEPS, STEP_SIZES, steps)):
        train = kind in ("train", "nograd")
        layer.train(train), bn.train(train)
        together = members
        xs = torch.cat([row[r][0] for r in together]).requires_grad_()
        x = row[rank][0].to(DEVICE, DTYPE).requires_grad_()
        ys, y = bn(xs), layer(x)
        ys.backward(torch.cat([row[r][1] for r in together])), y.backward(row[rank][1].to(DEVICE, DTYPE))
        start = sum(sizes[r] for r in together if r < rank)
        part = slice(start, start + sizes[rank])
        want = observe(bn, ys[part], None if xs.grad is None else xs.grad[part])
        agrees &= check(rank, s, kind, observe(layer, y, x.grad, group), want, tolerance(xs))
        layer.zero_grad(set_to_none=True), bn.zero_grad(set_to_none=True)
    dist.destroy_process_group()
    sys.exit(0 if agrees else 1)


def main():
    """Spawn the ranks; exit 1 if the SYMPTOM shows, 0 if every rank agrees with BatchNorm, 2 otherwise."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        mp.spawn(rank_main, (port,), nprocs=len(SPATIAL))
        seen, what = "pass", "every rank agrees with torch.nn.BatchNorm over the whole batch"
    except mp.ProcessRaisedException as e:  # a rank raised (a collective times out after 60 s): the traceback
        seen, what = ("hang" if "imed out" in str(e) else "error" if f"\n{ERROR_TYPE}: " in str(e) else "other"), e
    except mp.ProcessExitedException as e:  # a rank found a disagreement (exit 1) or died
        seen, what = ("crash" if e.signal_name else "mismatch" if e.exit_code == 1 else "other"), e
    print(f"{'SYMPTOM SHOWS' if seen == SYMPTOM else 'no symptom' if seen == 'pass' else 'OTHER'} ({seen}): {what}")
    return 1 if seen == SYMPTOM else 0 if seen == "pass" else 2


if __name__ == "__main__":
    sys.exit(main())
