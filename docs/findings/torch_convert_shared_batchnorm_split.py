#!/usr/bin/env python3
"""torch: a BatchNorm shared by two blocks stops sharing its running statistics after
convert_sync_batchnorm and a move of the model (.to(device or dtype), .cuda()).

convert_sync_batchnorm converts each place a module is registered separately, so one BatchNorm2d
registered at two places becomes two SyncBatchNorm modules over the same tensors. Module.to() (and
.cuda(), .double()) then gives each module its own copy of its buffers: the two halves of the
"shared" layer each see half of its calls, their running statistics drift apart, and evaluation
differs from the unconverted model's. Parameters stay shared (updated in place), so training
gradients are right and nothing warns.

What it runs: one process, no process group (SyncBatchNorm then normalizes exactly as BatchNorm):
the model and its converted copy moved with .to(DEVICE, torch.float64) (DEVICE: cuda when there is
a GPU, else cpu; the dtype change copies the float buffers the same way), three training steps on
the same batches, then eval. Expected: the converted model's running_mean of both registrations
equal the unconverted nn.BatchNorm2d's, and the same eval output. Actual (torch 2.13.0, 2.14.1, CPU):
running statistics off by 0.149, eval output by 0.109.

Severity: silent wrong value (running statistics, eval output). Reach: narrow: models that register
one BatchNorm at two places and convert before moving.

This file exits 1 on CPU (torch 2.13.0+cpu and 2.14.1+cu130); a past version (the same check,
moving to cuda) exited 1 on CUDA (H200, torch 2.11.0+cu130, the 2026-11-28 suite).
Needs only torch. Exit 1: the symptom shows (the two registrations' running_mean are separate
tensors after the move and the running statistics differ from nn.BatchNorm2d's by more than 1e-9);
0: the converted model matches nn.BatchNorm2d (running statistics and eval output within 1e-12);
2: anything else.
"""
import copy
import sys

import torch
from torch import nn

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SHOWS, AGREES = 1e-9, 1e-12  # float64: exact up to rounding


class Block(nn.Module):
    def __init__(self, norm):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 1)
        self.norm = norm

    def forward(self, x):
        return self.norm(self.conv(x))


class Model(nn.Module):
    """One BatchNorm2d registered at two places (`shared` and `stages.1.norm`) and called twice."""

    def __init__(self):
        super().__init__()
        self.shared = nn.BatchNorm2d(4)
        self.stages = nn.Sequential(Block(nn.BatchNorm2d(4)), Block(self.shared))

    def forward(self, x):
        return self.shared(self.stages(x))


def run():
    torch.manual_seed(0)
    plain = Model()
    synced = nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(plain))
    before = synced.shared.running_mean is synced.stages[1].norm.running_mean
    plain, synced = plain.to(DEVICE, torch.float64), synced.to(DEVICE, torch.float64)
    split = synced.shared.running_mean is not synced.stages[1].norm.running_mean
    print(f"converted: {'two modules' if synced.shared is not synced.stages[1].norm else 'one module'}; "
          f"running_mean shared before the move: {before}, after .to({DEVICE!r}, float64): {not split}")

    for _ in range(3):  # training steps: batch statistics, running statistics updated
        x = torch.randn(8, 4, 5, 5, device=DEVICE, dtype=torch.float64)
        plain(x).sum().backward()
        synced(x).sum().backward()
    x = torch.randn(8, 4, 5, 5, device=DEVICE, dtype=torch.float64)
    with torch.no_grad():
        expected, actual = plain.eval()(x), synced.eval()(x)

    stats_err = 0.0
    for name in ("shared", "stages.1.norm"):
        want, got = plain.get_submodule(name), synced.get_submodule(name)
        err = max((want.running_mean - got.running_mean).abs().max().item(),
                  (want.running_var - got.running_var).abs().max().item())
        print(f"{name}: running_mean expected {want.running_mean[0].item():.6g}, actual "
              f"{got.running_mean[0].item():.6g} (channel 0); running statistics max abs err {err:.3g}; "
              f"num_batches_tracked {got.num_batches_tracked.item()}, expected {want.num_batches_tracked.item()}")
        stats_err = max(stats_err, err)
    out_err = (expected - actual).abs().max().item()
    print(f"eval output max abs err {out_err:.3g}")
    return split, stats_err, out_err


def main():
    try:
        split, stats_err, out_err = run()
    except Exception as e:  # noqa: BLE001 - any exception is "something else"
        print(f"OTHER: {type(e).__name__}: {e}")
        return 2
    if split and stats_err > SHOWS:
        print(f"SYMPTOM SHOWS (mismatch): after the move the shared BatchNorm's two registrations hold separate "
              f"running statistics, off nn.BatchNorm2d's by {stats_err:.3g} (> {SHOWS:g}); eval output off by "
              f"{out_err:.3g}")
        return 1
    if stats_err <= AGREES and out_err <= AGREES:
        print("no symptom (pass): the shared BatchNorm stays one; running statistics and eval output match "
              "nn.BatchNorm2d")
        return 0
    print(f"OTHER: split {split}, running statistics off by {stats_err:.3g}, eval output by {out_err:.3g}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
