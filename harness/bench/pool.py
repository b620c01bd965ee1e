"""``bench pool``: time per case of the warm pool against a fresh process group per case.

The baseline is what a test suite of ``MultiProcessTestCase`` style pays: spawn
``world_size`` processes, initialize a process group, run one SyncBN forward and
backward, exit. The warm pool (:mod:`harness.engine.pool`) pays its start-up once,
then one task per case; its figure includes that start-up.
"""

from __future__ import annotations

import statistics
import time

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
    from harness.judge.status import RankStatus

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
    from harness.judge.status import Status

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
