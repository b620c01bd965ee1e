#!/usr/bin/env python3
"""torch.nn.SyncBatchNorm trains float32 input with float64 parameters but cannot evaluate it on CPU.

Found by `syncbn-harness search --impl torch` (torch 2.13.0+cpu, 2026-11-25, minimal case: two ranks,
one of them empty, one channel, 2-D, one eval step). In training, SyncBatchNorm's statistics ops take
float32 input with float64 weight and buffers (the harness's cpu-emulation runs torch's own module and
autograd Function over them; the oracle agrees); in evaluation the module calls F.batch_norm, whose CPU
kernel refuses the same combination: "mixed dtype (CPU): expect parameter to have scalar type of
Float". Single process, no distributed set-up needed to see the eval half. No upstream issue found.

Run: python torch_eval_mixed_dtype.py   (exit 1 while eval refuses, 0 once it works)
"""
import sys

import torch


def main() -> int:
    bn = torch.nn.BatchNorm1d(3).double().eval()  # what SyncBatchNorm's eval path runs: F.batch_norm
    x = torch.randn(4, 3)  # float32 input
    try:
        y = bn(x)
    except RuntimeError as exc:
        print(f"torch {torch.__version__}: eval of float32 input with float64 parameters fails: {exc}")
        return 1
    print(f"torch {torch.__version__}: eval works, output {y.dtype}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
