"""Real rank processes that issue the collectives SyncBN and DDP use, and save what each received.

:func:`run` starts ``world_size`` processes over one backend (a ``TCPStore``
on a port the OS picks), forked from the harness's forkserver as its ranks are
(fresh processes that inherit only its imports; spawned where it has none),
each of which calls :func:`exercise` and saves its results (a dict of
tensors) with ``torch.save``; it returns them per rank. Every wait is bounded and every process is reaped.
"""

from __future__ import annotations

import datetime
import os
import shutil
import tempfile

import torch

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _flat_all_gathers():
    import torch.distributed as dist

    names = ("all_gather_single", "all_gather_into_tensor", "_all_gather_base")
    return [(n, getattr(dist, n)) for n in names if hasattr(dist, n)]


def exercise(rank: int, world_size: int, flat_shape, flat: bool = True) -> dict:
    """Every collective SyncBN (forward all_gather, backward all_reduce) and DDP (broadcast, all_reduce) issue.

    ``flat_shape(n)``: the shape of a flat all_gather's output for ``n`` elements (gloo takes ``[n]``; torch's
    SyncBatchNorm hands other backends ``[1, n]``, which NCCL accepts). ``flat=False``: the backend has no flat
    all_gather; each call's refusal is kept (``<name>.refused``: the exception's type and message).
    """
    import torch.distributed as dist

    out: dict = {}
    sub = dist.new_group([0, world_size - 1])  # a subgroup: rank order in the flat output must follow it
    for dtype in DTYPES:
        gen = torch.Generator().manual_seed(1000 * rank + DTYPES.index(dtype))
        x = torch.randn(11, generator=gen).to(dtype)
        dt = str(dtype).replace("torch.", "")
        rows = [torch.empty_like(x) for _ in range(world_size)]
        dist.all_gather(rows, x)
        out[f"all_gather.{dt}"] = torch.stack(rows)
        for name, fn in _flat_all_gathers():
            flat_out = torch.empty(flat_shape(world_size * x.numel()), dtype=dtype)
            if not flat:
                try:
                    fn(flat_out, x)
                except Exception as exc:  # noqa: BLE001 - the refusal is the result
                    out[f"{name}.refused"] = f"{type(exc).__name__}: {exc}"
                continue
            fn(flat_out, x)
            out[f"{name}.{dt}"] = flat_out
            if rank in (0, world_size - 1):
                flat_sub = torch.empty(2 * x.numel(), dtype=dtype)
                fn(flat_sub, x, group=sub)
                out[f"{name}.sub.{dt}"] = flat_sub
        y = x.clone()
        dist.all_reduce(y)
        out[f"all_reduce.{dt}"] = y
        b = x.clone()
        dist.broadcast(b, src=world_size - 1)
        out[f"broadcast.{dt}"] = b
    dist.barrier()
    return out


def _rank(rank: int, world_size: int, port: int, backend: str, outdir: str) -> None:
    import torch.distributed as dist

    from harness.engine import list_contract, nccl_contract

    if backend == nccl_contract.NAME:
        nccl_contract.register()
    elif backend == list_contract.LIST_NAME:
        list_contract.register_list_contract()
    timeout = datetime.timedelta(seconds=60)
    store = dist.TCPStore("127.0.0.1", port, world_size + 1, False, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    try:
        results = exercise(rank, world_size, (lambda n: (n,)) if backend == "gloo" else (lambda n: (1, n)),
                           flat=backend != list_contract.LIST_NAME)
        results["backend_name"] = dist.group.WORLD._get_backend_name()
    finally:
        dist.destroy_process_group()
    torch.save(results, os.path.join(outdir, f"rank{rank}.pt"))


def run(world_size: int, backend: str, timeout: float = 120.0) -> list[dict]:
    """Each rank's results of :func:`exercise` over ``backend``."""
    import torch.distributed as dist

    from harness.engine import forkserver

    ctx = forkserver.start_context()
    outdir = tempfile.mkdtemp(prefix="collective-ranks-")
    store = dist.TCPStore("127.0.0.1", 0, world_size + 1, True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout))
    procs = [ctx.Process(target=_rank, args=(r, world_size, store.port, backend, outdir), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(timeout)
        codes = [p.exitcode for p in procs]
        if codes != [0] * world_size:
            raise AssertionError(f"ranks over {backend} exited with {codes}")
        return [torch.load(os.path.join(outdir, f"rank{r}.pt")) for r in range(world_size)]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
        shutil.rmtree(outdir, ignore_errors=True)
