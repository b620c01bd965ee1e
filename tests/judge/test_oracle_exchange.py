"""The oracle of a case drawn per rank, each rank holding only its own tensors and exchanging the group-wide sums,
is the oracle of a process holding every rank's, bit for bit, in real processes over gloo.

Each of three processes makes its own part of every case (``materialize(case, ranks=[rank])``), runs the oracle
with the harness's exchange, and compares every entry of its own truth with the one a single process computes
from all ranks' tensors. The cases cover subgroups, empty ranks, batch sizes that change between steps,
evaluation with and without running statistics, momentum None and a step refused for one value per channel.
"""

from __future__ import annotations

import socket

import torch

from harness.engine import forkserver
from harness.search import space

WORLD = 3
CASES = [
    dict(batch_sizes=(3, 0, 2), spatial=((2, 3),) * 3, channels=4, steps=("train", "eval", "train"),
         groups=((0,), (1, 2)), seed=11),
    dict(batch_sizes=(2, 4, 1), spatial=((5,),) * 3, channels=3, steps=("train", "train", "eval-rank0"),
         step_batch_sizes=((2, 4, 1), (0, 3, 3), (1, 1, 1)), momentum=None, seed=12),
    dict(batch_sizes=(2, 2, 3), spatial=((), (), ()), channels=5, steps=("eval", "train"), track_running_stats=False,
         input_mean=1000.0, input_scale=0.5, seed=13),
    dict(batch_sizes=(1, 0, 0), spatial=((), (), ()), channels=2, steps=("train", "train"), seed=14),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _oracle(case, data, rank, exchange=None):
    from harness.catalog.data import DTYPES
    from harness.judge.oracle import run_oracle

    return run_oracle(data.inputs, data.grad_outputs, case.steps, num_features=case.channels, eps=case.eps,
                      momentum=case.momentum, affine=case.affine, track_running_stats=case.track_running_stats,
                      weight=data.weight, bias=data.bias, param_dtype=DTYPES[case.param_dtype],
                      running_mean=data.running_mean, running_var=data.running_var, groups=case.groups,
                      ranks=[rank], exchange=exchange)


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    return a == b


def _rank(rank: int, port: int, errors) -> None:
    import torch.distributed as dist

    from harness.catalog.data import materialize
    from harness.engine.exchange import Exchange

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        ex = Exchange(rank, WORLD)
        ex.prepare()
        for fields in CASES:
            case = space.make_case(**fields)
            want = _oracle(case, materialize(case), rank)
            mine = materialize(case, ranks=[rank])
            assert all(mine.inputs[s][r] is None for s in range(len(case.steps)) for r in range(WORLD) if r != rank)
            got = _oracle(case, mine, rank, ex.sum)
            if len(got) != len(want):
                errors.put(f"{case.id} rank {rank}: {len(got)} steps, want {len(want)}")
            for s, (g, w) in enumerate(zip(got, want)):
                for name in ("output", "grad_input", "grad_weight", "grad_bias", "running_mean", "running_var",
                             "num_batches_tracked", "mean", "invstd", "count", "mean_abs_dy", "mean_abs_dy_xhat",
                             "rank_abs_dy", "rank_abs_dy_xhat"):
                    if not _same(getattr(g, name)[rank], getattr(w, name)[rank]):
                        errors.put(f"{case.id} rank {rank} step {s} {name}: {getattr(g, name)[rank]} != "
                                   f"{getattr(w, name)[rank]}")
                if g.raises != w.raises:
                    errors.put(f"{case.id} rank {rank} step {s}: raises {g.raises!r}, want {w.raises!r}")
        errors.put(f"rank {rank} calls {ex.calls}")
    finally:
        dist.destroy_process_group()


def test_the_exchanged_oracle_is_the_whole_oracle_bit_for_bit():
    ctx = forkserver.start_context()  # fresh processes with torch already imported
    errors = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, errors)) for r in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=200)
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
    assert not alive, "a rank did not finish"
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    said = []
    while not errors.empty():
        said.append(errors.get())
    calls = [m for m in said if m.startswith("rank ")]
    wrong = [m for m in said if not m.startswith("rank ")]
    assert not wrong, "\n".join(wrong[:10])
    # Two exchanges per case with a training step (all four have one), the same on every rank.
    assert sorted(calls) == [f"rank {r} calls {2 * len(CASES)}" for r in range(WORLD)]
