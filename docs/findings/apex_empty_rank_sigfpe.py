#!/usr/bin/env python3
"""apex: a rank dies (SIGFPE).

2 processes on CUDA run apex (5 channels, float16 input, float32 parameters, inputs 0.5 + 2 x
N(offset, spread)) on their parts of one batch (0, 5 samples of spatial size (4, 3); steps: train)
and compare the output with torch.nn.BatchNorm2d over the whole batch in float64.

Seen: crash on torch 2.11.0+cu130 (optimized) with apex, cuda/gloo, syncbn-harness case
allgather-shape/empty-0-5/float16-float32/contiguous/ws2.
Needs only torch and apex and a GPU (apex's kernels here are CUDA kernels). Exit 1: the symptom
shows; 0: it does not (fixed); 2: something else failed.
"""
import datetime
import math
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

try:
    from apex.parallel import SyncBatchNorm
except ImportError as exc:  # reported by main, exit 2
    SyncBatchNorm, IMPORT_ERROR = None, f"{type(exc).__name__}: {exc}"
C, SPATIAL = 5, [(4, 3), (4, 3)]  # channels; each rank's spatial size
STEP_SIZES = [[0, 5]]  # each step's batch size per rank
STEPS = ['train']  # train, eval: forward and backward; nograd: training forward, no_grad
DTYPE, PARAM_DTYPE = torch.float16, torch.float32  # input; parameters and buffers
LAYER = dict(eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)
INPUT_MEAN, INPUT_SCALE, CONSTANT_CHANNELS = 0.5, 2.0, []
SEED = 1499684978
SYMPTOM, QUANTITY, ERROR_TYPE = 'crash', 'output', None  # what shows the defect
# Tolerance: 16 unit roundoffs of the quantity's dtype, plus 16 of the accumulation type (float32;
# float64 for float64 input) x log2(values per channel) x the input's max|x| / sqrt(var + eps)
U_Q, U_ACC = 0.00048828125, 5.960464477539063e-08
BN = torch.nn.BatchNorm2d
DEVICE = "cuda"
BACKEND = "nccl" if DEVICE == "cuda" and torch.cuda.device_count() >= len(SPATIAL) else "gloo"


def data():
    """The parameters and each step's per-rank (input, upstream gradient), drawn in float64 from SEED."""
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
            x = torch.randn(shape, **f64) * scale.view(b) + off.view(b)
            x = x * INPUT_SCALE + INPUT_MEAN
            for c in CONSTANT_CHANNELS:
                x[:, c] = INPUT_MEAN + INPUT_SCALE * off[c]
            steps[-1].append((x.to(DTYPE).double(), torch.randn(shape, **f64).to(DTYPE).double()))
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


def rank_main(rank, port):
    """The layer on this rank's part of each step's batch, beside BatchNorm on the whole batch."""
    torch.cuda.set_device(rank % torch.cuda.device_count())
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
