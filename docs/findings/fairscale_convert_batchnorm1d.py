#!/usr/bin/env python3
"""fairscale.experimental.nn.SyncBatchNorm.convert_sync_batchnorm: a converted BatchNorm1d trains, then eval raises.

The converter turns every _BatchNorm, BatchNorm1d included (its docstring's own example is Linear +
BatchNorm1d), into fairscale's SyncBatchNorm, a BatchNorm2d. Training takes fairscale's own path,
which accepts 2-D input; eval falls back to BatchNorm2d.forward, which refuses it. 2 processes (gloo,
CPU) train the docstring's model one step, then evaluate; eval is compared with torch.nn.BatchNorm1d
in float64 over the whole batch.

Seen: error on torch 2.13.0+cpu with fairscale 0.4.13 (the conversion family of syncbn-harness; this
file is written by hand, the generated short form covers single layers).
Needs only torch and fairscale. Exit 1: the symptom shows; 0: it does not (fixed); 2: something else failed.
"""
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fairscale.experimental.nn import SyncBatchNorm

SIZES, C, SEED = [3, 5], 100, 0


def rank_main(rank, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=len(SIZES))
    torch.manual_seed(SEED)  # the same Linear weights and inputs on every rank
    xs = [torch.randn(n, 20, dtype=torch.float64) for n in SIZES]  # every rank's part, everywhere
    model = torch.nn.Sequential(torch.nn.Linear(20, C), torch.nn.BatchNorm1d(C)).double()
    reference = torch.nn.Sequential(torch.nn.Linear(20, C), torch.nn.BatchNorm1d(C)).double()
    reference.load_state_dict(model.state_dict())
    model = SyncBatchNorm.convert_sync_batchnorm(model).double()
    model(xs[rank]).sum().backward()  # one training step: fairscale's path, fine with 2-D input
    reference(torch.cat(xs))
    model.eval(), reference.eval()
    try:
        got = model(xs[rank])
    except ValueError as exc:
        print(f"rank {rank}: eval of the converted BatchNorm1d raises ValueError: {exc}\n", end="")
        sys.exit(1)
    want = reference(xs[rank])
    err = float((got - want).abs().max() / want.abs().max())
    print(f"rank {rank}: eval output, max rel err {err:.3g} against torch.nn.BatchNorm1d\n", end="")
    sys.exit(0 if err < 1e-9 else 2)


def main():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        mp.spawn(rank_main, (port,), nprocs=len(SIZES))
    except mp.ProcessExitedException as e:
        print(f"{'SYMPTOM SHOWS' if e.exit_code == 1 else 'OTHER'}: {e}")
        return 1 if e.exit_code == 1 else 2
    except mp.ProcessRaisedException as e:
        print(f"OTHER: {e}")
        return 2
    print("no symptom: eval works and agrees with torch.nn.BatchNorm1d")
    return 0


if __name__ == "__main__":
    sys.exit(main())
