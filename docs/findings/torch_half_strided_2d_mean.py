#!/usr/bin/env python3
"""torch on CUDA: BatchNorm1d on a non-contiguous float16 (N, C) input rounds the batch mean to float16.

torch.nn.BatchNorm1d(64) with float32 parameters (as under autocast), in training, on CUDA, gets a float16
(N, C) input that is a view: every other row, the transpose of a (C, N) tensor, or half of the columns
(a chunk along dim 1, as after a Linear split in two). The values are the same as those of a contiguous
copy, but for the view the batch mean comes out rounded to float16 (an error up to one float16 ulp of the
mean, 2**-11 of it), and so do running_mean and the output. The variance stays exact. The error grows with
the mean against the spread: with mean 100 and spread 1, it is 0.03 in every normalized value.

The contiguous copy of the same values, 3-D inputs (N, C, L) of every layout, and CPU are exact to
float32. torch.nn.SyncBatchNorm inherits the error wherever it calls the plain batch norm: outside an
initialized process group, in a group of one process, and in eval without running statistics. Its
synchronized training path makes the input contiguous first.

Seen on CUDA (NVIDIA H200, torch 2.11.0+cu130) with syncbn-harness (search cases
search/float16-float32/contiguous/even-2-2/c1/groups-0-1+sliced/train/ws2-5e7b2416 and
search/float16-float32/contiguous/empty-0-0/c67/no-running-stats+sizes-change+permuted/eval-eval/ws2-d601ee8a).
A past version of this file (the same check, less exact exit codes) was run on the H200 (torch 2.11.0+cu130),
mean off by 0.0293 for every view; no log of that run was kept. This file exits 2 on CPU: the defect is in a
CUDA code path.
Needs torch and a GPU. Exit 1: the symptom shows (a view's batch mean is off by more than 2**-16 of the mean,
64 times float32's rounding, while the contiguous copy's is within 2**-22 of it); 0: every layout's batch mean
is within 2**-22 of the mean; 2: anything else (no GPU, an exception, the contiguous copy off too, an error in
between).
"""
import sys

import torch

N, C, MEAN = 256, 64, 100.0


def views(x):
    """The same (N, C) values as a contiguous tensor and as three non-contiguous views."""
    rows = torch.zeros((2 * N, C), dtype=x.dtype, device=x.device)
    rows[::2] = x
    cols = torch.zeros((N, 2 * C), dtype=x.dtype, device=x.device)
    cols[:, :C] = x
    return {"contiguous": x.clone(), "every other row": rows[::2], "transposed": x.t().contiguous().t(),
            "first chunk of columns": cols.chunk(2, dim=1)[0]}


def measure():
    """Per (layer class, view): the batch mean's max error (running_mean with momentum 1) against float64."""
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn((N, C), generator=gen) + MEAN).half()
    x64 = x.double()
    mean64, var64 = x64.mean(0), x64.var(0, unbiased=False)
    y64 = (x64 - mean64) / torch.sqrt(var64 + 1e-5)
    errors = {}
    for name, layer_cls in (("BatchNorm1d", torch.nn.BatchNorm1d), ("SyncBatchNorm", torch.nn.SyncBatchNorm)):
        for view, xv in views(x.cuda()).items():
            layer = layer_cls(C, momentum=1.0).cuda()  # momentum 1: running_mean is the batch mean
            y = layer(xv)
            mean_err = (layer.running_mean.double().cpu() - mean64).abs().max().item()
            out_err = (y.double().cpu() - y64).abs().max().item()
            errors[name, view] = mean_err
            print(f"{name:13} {view:22} contiguous={xv.is_contiguous()!s:5}  "
                  f"batch mean error {mean_err:.3g}  output error {out_err:.3g}")
    return errors


def main():
    if not torch.cuda.is_available():
        print("OTHER: needs a GPU (the defect is in torch's CUDA batch norm)")
        return 2
    try:
        errors = measure()
    except Exception as e:  # noqa: BLE001 - any exception is "something else"
        print(f"OTHER: {type(e).__name__}: {e}")
        return 2
    exact, shows = 2.0 ** -22 * MEAN, 2.0 ** -16 * MEAN  # float32 rounding of the mean, with room; 64 times it
    dense = max(e for (_, view), e in errors.items() if view == "contiguous")
    worst = max(errors.values())
    if dense > exact:
        print(f"OTHER: the contiguous input's batch mean is off too ({dense:.3g} > {exact:.3g})")
        return 2
    if worst > shows:
        off = sorted({f"{name} {view}" for (name, view), e in errors.items() if e > shows})
        print(f"SYMPTOM SHOWS (mismatch): a non-contiguous view's batch mean is off by up to {worst:.3g} "
              f"(> {shows:.3g}; float16's ulp at {MEAN:g} is {2.0 ** -4:g}) for {'; '.join(off)}; "
              f"the contiguous copy's by {dense:.3g}")
        return 1
    if worst <= exact:
        print(f"no symptom (pass): every layout's batch mean is exact to float32 (max error {worst:.3g})")
        return 0
    print(f"OTHER: a view's batch mean is off by {worst:.3g}, between {exact:.3g} and {shows:.3g}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
