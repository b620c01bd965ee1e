#!/usr/bin/env python3
"""apex's optimized SyncBatchNorm cannot evaluate with channel_last=True: UnboundLocalError count_all.

One process (a group of one) runs apex.parallel.SyncBatchNorm(4, channel_last=True), built with its syncbn
CUDA extension, in eval mode on an NHWC tensor, and compares the output with torch.nn.BatchNorm2d in eval mode
(the same running statistics) on the same values in float64. In eval, apex falls back to F.batch_norm only
when channel_last is False (apex/parallel/optimized_sync_batchnorm.py); otherwise SyncBatchnormFunction takes
its running-statistics branch, which never assigns count_all, and then saves count_all for backward.
NVIDIA/apex#913 (open) reports it with BatchNorm1d input, which apex always treats as channel-last.

Seen: apex e13873de with its syncbn extension, torch 2.11.0+cu130, H200. Needs torch, apex built with its
syncbn extension, and a GPU. Exit 1: the symptom shows; 0: it does not (fixed); 2: something else failed.
"""
import socket
import sys

import torch
import torch.distributed as dist
try:
    from apex.parallel import SyncBatchNorm
except ImportError as exc:  # reported by main, exit 2
    SyncBatchNorm, IMPORT_ERROR = None, f"{type(exc).__name__}: {exc}"

C = 4


def main():
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
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(2, 3, 5, C, generator=g, dtype=torch.float64)  # N, H, W, C
        layer = SyncBatchNorm(C, channel_last=True).cuda().eval()
        bn = torch.nn.BatchNorm2d(C).double().eval()
        want = bn(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        try:
            y = layer(x.float().cuda())
        except UnboundLocalError as exc:
            print(f"SYMPTOM SHOWS (error): UnboundLocalError: {exc}")
            return 1
        err = (y.double().cpu() - want).abs().max().item()
        print(f"{'no symptom' if err < 1e-5 else 'OTHER'}: eval output max abs error {err:.3g}")
        return 0 if err < 1e-5 else 2
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
