#!/usr/bin/env python3
"""torch.nn.BatchNorm2d on CPU: wrong input gradient for an input whose size-1 dims have unit strides.

The input is a dense view of shape (1, C, 1, W) with strides (1, 1, 1, C) (a transpose of a contiguous
(W, C, 1, 1) tensor: channels-last by torch's rule, which ignores size-1 dims). The forward is right;
the backward's grad_input is off by O(1), in training and in eval. The same values in a tensor made
with .contiguous(memory_format=torch.channels_last) are right. Compared with BatchNorm2d in float64 on
the same values (a plain contiguous copy).

Seen: torch 2.13.0+cpu, CPU (torch's own CPU kernel; not cpu-emulation). Found by syncbn-harness through
torch.nn.SyncBatchNorm, which calls F.batch_norm where it does not synchronize (eval). Written by hand.
Needs only torch. Exit 1: the symptom shows; 0: it does not (fixed).
"""
import sys

import torch

C, W = 8, 5


def main():
    torch.manual_seed(0)
    values = torch.randn(1, C, 1, W, dtype=torch.float64)
    grad = torch.randn(1, C, 1, W, dtype=torch.float64)
    shown = False
    for training in (True, False):
        bn = torch.nn.BatchNorm2d(C).train(training)
        with torch.no_grad():
            bn.running_mean.normal_(), bn.running_var.uniform_(0.5, 1.5), bn.weight.uniform_(0.5, 1.5)
        reference = torch.nn.BatchNorm2d(C).double().train(training)
        reference.load_state_dict(bn.state_dict())

        base = values.transpose(0, -1).contiguous().float().requires_grad_()  # (W, C, 1, 1), contiguous
        x = base.transpose(0, -1)  # (1, C, 1, W), strides (1, 1, 1, C)
        bn(x).backward(grad.float())
        x64 = values.clone().requires_grad_()
        reference(x64).backward(grad)

        got, want = base.grad.transpose(0, -1).double(), x64.grad
        rel = float((got - want).abs().max() / want.abs().max())
        print(f"{'train' if training else 'eval '}: input strides {x.stride()}, grad_input max rel err {rel:.3g} "
              f"(float32 would be ~1e-6)")
        shown |= rel > 1e-4
    print("SYMPTOM SHOWS" if shown else "no symptom: grad_input agrees with float64 BatchNorm2d")
    return 1 if shown else 0


if __name__ == "__main__":
    sys.exit(main())
