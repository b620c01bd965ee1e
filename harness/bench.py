"""Benchmarks: every figure is a ratio against a baseline measured in the same run.

``kernels``: each CPU op of the reference extension and a whole reference
forward+backward (one process, no communication), side by side with torch's
own CPU ``batch_norm`` forward+backward on the same tensor and with a plain
copy of the same bytes (the memory-bandwidth ceiling).

``pool``: time per case of the warm pool against a fresh process group per
case (spawn, init, one SyncBN forward+backward, exit), at world size 2.

Times are medians over repetitions after a warm-up; these machines are noisy,
so only the ratios are meant to be compared across runs.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

KERNEL_SHAPES = [
    ("N32 C64 56x56 float32 contiguous", (32, 64, 56, 56), torch.float32, torch.contiguous_format),
    ("N32 C64 56x56 float32 channels_last", (32, 64, 56, 56), torch.float32, torch.channels_last),
    ("N32 C64 56x56 float16 contiguous", (32, 64, 56, 56), torch.float16, torch.contiguous_format),
    ("N32 C64 56x56 float16 channels_last", (32, 64, 56, 56), torch.float16, torch.channels_last),
]


def median_time(fn: Callable[[], object], *, repeat: int = 7, warmup: int = 2) -> float:
    """Median wall time of ``fn()`` in seconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@dataclass
class Row:
    name: str
    seconds: float
    bytes_moved: int

    @property
    def gbps(self) -> float:
        return self.bytes_moved / self.seconds / 1e9


def bench_kernels(repeat: int = 7, echo=print) -> list[dict]:
    """Run the kernel benchmark, print a table per shape, return the figures."""
    from harness.kernels import extension

    extension.load()
    ops = torch.ops.syncbn_ref
    echo(f"torch {torch.__version__}, {torch.get_num_threads()} threads; median of {repeat} runs")
    return [_bench_shape(ops, label, shape, dtype, fmt, repeat, echo) for label, shape, dtype, fmt in KERNEL_SHAPES]


def _bench_shape(ops, label, shape, dtype, fmt, repeat, echo) -> dict:
    """One shape of the kernel benchmark: each op, copy, torch and reference fwd+bwd."""
    from harness.impls.reference import SyncBatchNorm

    g = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=g) * 2 + 1).to(dtype).contiguous(memory_format=fmt)
    dy = torch.randn(shape, generator=g).to(dtype).contiguous(memory_format=fmt)
    C = shape[1]
    nbytes = x.numel() * x.element_size()
    w = torch.randn(C)
    b = torch.randn(C)
    dst = torch.empty_like(x)
    mean, invstd = ops.batch_norm_stats(x, 1e-5)
    sum_dy, sum_dy_xmu, _, _ = ops.batch_norm_backward_reduce(dy, x, mean, invstd, w, True, True, True)
    count = torch.tensor([x.numel() // C], dtype=torch.int32)
    rows = [
        Row("copy (bandwidth ceiling)", median_time(lambda: dst.copy_(x), repeat=repeat), 2 * nbytes),
        Row("batch_norm_stats", median_time(lambda: ops.batch_norm_stats(x, 1e-5), repeat=repeat), nbytes),
        Row("welford_stats", median_time(lambda: ops.welford_stats(x), repeat=repeat), nbytes),
        Row("batch_norm_elemt", median_time(lambda: ops.batch_norm_elemt(x, w, b, mean, invstd, 1e-5),
                                            repeat=repeat), 2 * nbytes),
        Row("batch_norm_backward_reduce",
            median_time(lambda: ops.batch_norm_backward_reduce(dy, x, mean, invstd, w, True, True, True),
                        repeat=repeat), 2 * nbytes),
        Row("batch_norm_backward_elemt",
            median_time(lambda: ops.batch_norm_backward_elemt(dy, x, mean, invstd, w, sum_dy, sum_dy_xmu,
                                                              count), repeat=repeat), 3 * nbytes),
    ]

    ref = SyncBatchNorm(C).to(torch.float32)

    def ref_fb():
        xi = x.detach().requires_grad_(True)
        ref(xi).backward(dy)

    torch_w = torch.nn.Parameter(w.to(dtype if dtype == torch.float32 else torch.float32))
    torch_b = torch.nn.Parameter(b.to(torch_w.dtype))
    rm, rv = torch.zeros(C), torch.ones(C)

    def torch_fb():
        xi = x.detach().requires_grad_(True)
        torch.nn.functional.batch_norm(xi, rm, rv, torch_w, torch_b, True, 0.1, 1e-5).backward(dy)

    t_ref = median_time(ref_fb, repeat=repeat)
    t_torch = median_time(torch_fb, repeat=repeat)
    copy_gbps = rows[0].gbps
    echo(f"\n{label}  ({nbytes / 1e6:.1f} MB per tensor)")
    echo(f"  {'op':<34} {'ms':>8} {'GB/s':>8} {'of copy':>8}")
    for r in rows:
        echo(f"  {r.name:<34} {r.seconds * 1e3:8.2f} {r.gbps:8.2f} {r.gbps / copy_gbps:8.2f}")
    echo(f"  {'torch F.batch_norm fwd+bwd':<34} {t_torch * 1e3:8.2f}")
    echo(f"  {'reference SyncBN fwd+bwd':<34} {t_ref * 1e3:8.2f}   ratio to torch: {t_ref / t_torch:.2f}x")
    return {"shape": label, "ops": {r.name: {"ms": r.seconds * 1e3, "gbps": r.gbps} for r in rows},
                "torch_fwd_bwd_ms": t_torch * 1e3, "reference_fwd_bwd_ms": t_ref * 1e3,
                "reference_over_torch": t_ref / t_torch,
            "stats_over_copy_bandwidth": rows[1].gbps / copy_gbps}


# ---------------------------------------------------------------------- pool

POOL_CASES = ("allgather-shape/uneven-2-6/float32-float32/contiguous/ws2",
              "allgather-shape/even-4-4/float32-float32/contiguous/ws2",
              "channels-last/uneven/channels_last/ws2", "mixed-precision/uneven/float16-float32/ws2",
              "module-config/input-2d/ws2")


def _fresh_rank(rank: int, world_size: int, port: int, case_dict: dict) -> None:
    """One rank of the fresh-process-group baseline: join, one SyncBN forward+backward, leave."""
    import torch.distributed as dist

    from harness.catalog.case import Case
    from harness.engine.messages import Task
    from harness.engine.rank import RankContext, run_task
    from harness.results.records import RankStatus

    store = dist.TCPStore("127.0.0.1", port, world_size + 1, False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    result = run_task(RankContext(rank, world_size), Task(case=case_dict, impl="reference", device="cpu"))
    dist.destroy_process_group()
    if result.status != RankStatus.PASS:
        raise SystemExit(f"fresh baseline case {Case.from_dict(case_dict).id} gave {result.status.value}")


def fresh_process_group_case(case_dict: dict, world_size: int = 2) -> None:
    """Spawn ``world_size`` processes, init a process group, run one case, exit (MultiProcessTestCase style)."""
    import multiprocessing as mp

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, world_size + 1, True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_fresh_rank, args=(r, world_size, store.port, case_dict)) for r in range(world_size)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
        if p.is_alive():
            p.kill()
            p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"fresh baseline rank exited with {p.exitcode}")


def bench_pool(cases: int = 300, fresh_cases: int = 5, echo=print) -> dict:
    """Per-case time of the warm pool (start-up included) against a fresh process group per case."""
    from harness import catalog
    from harness.engine.messages import Task
    from harness.engine.pool import Pool
    from harness.results.records import Status

    selected = catalog.select(list(POOL_CASES))
    tasks = [Task(case=c.to_dict(), impl="reference", device="cpu") for c in selected]
    fresh_times = []
    for i in range(fresh_cases):
        t0 = time.perf_counter()
        fresh_process_group_case(tasks[i % len(tasks)].case)
        fresh_times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    with Pool(2, setup_impls=("reference",)) as pool:
        pool.start()
        startup = time.perf_counter() - t0
        for i in range(cases):
            outcome = pool.run(tasks[i % len(tasks)], timeout=120)
            if outcome.status != Status.PASS:
                raise RuntimeError(f"warm pool case {selected[i % len(selected)].id}: {outcome.status}")
    warm_total = time.perf_counter() - t0
    warm = warm_total / cases
    fresh = statistics.median(fresh_times)
    echo(f"fresh process group per case: {fresh * 1e3:8.1f} ms/case (median of {fresh_cases})")
    echo(f"warm pool, start-up included: {warm * 1e3:8.1f} ms/case ({cases} cases, start-up {startup:.2f}s, "
         f"total {warm_total:.2f}s)")
    echo(f"speed-up: {fresh / warm:.0f}x")
    return {"fresh_ms": fresh * 1e3, "warm_ms": warm * 1e3, "startup_s": startup, "cases": cases,
            "speedup": fresh / warm}
