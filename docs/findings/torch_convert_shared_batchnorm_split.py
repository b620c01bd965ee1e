#!/usr/bin/env python3
"""torch: a BatchNorm shared by two blocks stops sharing its running statistics after
convert_sync_batchnorm and a move to the GPU.

convert_sync_batchnorm converts each place a module is registered separately, so one BatchNorm2d
registered at two places becomes two SyncBatchNorm modules over the same tensors. Module.to() (and
.cuda()) then gives each module its own copy of its buffers: the two halves of the "shared" layer
each see half of its calls, their running statistics drift apart, and evaluation differs from the
unconverted model's. Parameters stay shared, so training gradients are right and nothing warns.

The unconverted model is nn.BatchNorm2d over the same whole batch, trained the same way in the same
process. One process needs no process group: SyncBatchNorm then normalizes exactly as BatchNorm.
Moving to float64 on the CPU copies the buffers the same way, so the file also runs without a GPU.

Seen: syncbn-harness case conversion/checkpoint-revert/nested/float32/ws2 (and the other
conversion/*/nested cases) on torch 2.11.0+cu130, CUDA (H100), gloo.
Needs only torch. Exit 1: the symptom shows; 0: it does not (fixed).
"""
import copy
import sys

import torch
from torch import nn

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


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


def main():
    torch.manual_seed(0)
    plain = Model()
    synced = nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(plain))
    before = synced.shared.running_mean is synced.stages[1].norm.running_mean
    plain, synced = plain.to(DEVICE, torch.float64), synced.to(DEVICE, torch.float64)
    after = synced.shared.running_mean is synced.stages[1].norm.running_mean
    print(f"converted: {synced.shared is not synced.stages[1].norm and 'two modules' or 'one module'}; "
          f"running_mean shared before the move: {before}, after .to({DEVICE!r}, float64): {after}")

    for _ in range(3):  # training steps: batch statistics, running statistics updated
        x = torch.randn(8, 4, 5, 5, device=DEVICE, dtype=torch.float64)
        plain(x).sum().backward()
        synced(x).sum().backward()
    x = torch.randn(8, 4, 5, 5, device=DEVICE, dtype=torch.float64)
    with torch.no_grad():
        expected, actual = plain.eval()(x), synced.eval()(x)

    bad = False
    for name in ("shared", "stages.1.norm"):
        want, got = plain.get_submodule(name), synced.get_submodule(name)
        err = (want.running_mean - got.running_mean).abs().max().item()
        print(f"{name}: num_batches_tracked {got.num_batches_tracked.item()}, expected "
              f"{want.num_batches_tracked.item()}; running_mean max abs err {err:.3g}")
        bad |= err > 1e-12 or got.num_batches_tracked.item() != want.num_batches_tracked.item()
    err = (expected - actual).abs().max().item()
    print(f"eval output max abs err {err:.3g}")
    bad |= err > 1e-12
    print("SYMPTOM SHOWS (mismatch)" if bad else "no symptom: the shared BatchNorm stays one")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
