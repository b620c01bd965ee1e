"""The collective recorder: every call written down as plain data, and none allowed where none may be."""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

from harness.engine import collectives
from harness.judge.call import Call


@pytest.fixture
def one_rank_group():
    store = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))
    collectives.install_recorder()
    collectives.begin_task()
    yield
    dist.destroy_process_group()


def test_calls_are_recorded_with_op_group_dtype_shape_and_step(one_rank_group):
    collectives.mark_step(3)
    t = torch.ones(5, dtype=torch.float16)
    dist.all_reduce(t)
    rows = [torch.empty(2, 3)]
    dist.all_gather(rows, torch.zeros(2, 3))
    out = torch.empty(4)
    flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
    flat(out, torch.zeros(4))
    assert torch.equal(t, torch.ones(5, dtype=torch.float16))  # the call itself is unchanged
    calls = collectives.recorded()
    assert [(c["op"], c["dtype"], c["shape"], c["group"], c["step"]) for c in calls] == [
        ("all_reduce", "float16", [5], [0], 3), ("all_gather", "float32", [2, 3], [0], 3),
        (flat.__name__, "float32", [4], [0], 3)]
    assert collectives.recorded() == calls  # every call of the task, however often asked
    assert [list(c) for c in calls] == [["op", "group", "step", "dtype", "shape", "numel"]] * 3  # the stored form
    assert [Call.from_dict(c).to_dict() for c in calls] == calls
    collectives.begin_task()
    assert collectives.recorded() == []


def test_a_forbidden_collective_raises_before_it_is_issued(one_rank_group):
    t = torch.ones(3)
    with collectives.forbid_collectives("evaluation on rank 0 alone"):
        with pytest.raises(collectives.CollectiveForbidden,
                           match=r"all_reduce issued during evaluation on rank 0 alone \(all_reduce float32\[3\] "
                                 r"over ranks \[0\]\)"):
            dist.all_reduce(t)
    assert collectives.recorded() == []
    dist.all_reduce(t)  # allowed again after the block
    assert [c["op"] for c in collectives.recorded()] == ["all_reduce"]
    collectives.begin_task()
