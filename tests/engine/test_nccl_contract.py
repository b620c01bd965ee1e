"""The nccl-contract backend: bitwise gloo for every collective SyncBN and DDP use, NCCL's flat all_gather contract.

Real processes over real process groups (tests/support/collective_ranks.py):
the same seeded tensors go through gloo and through nccl-contract, and every
result must be the same bits. The flat all_gather is also checked against
what NCCL promises (rank r's input in the r-th slice, whatever the output's
shape, subgroups in group order) and against NCCL's refusals.
"""

from __future__ import annotations

import pytest
import torch

import collective_ranks
from harness.engine.nccl_contract import NAME, _flat_views
from harness.judge.invariants import bits

FLAT = ("all_gather_single", "all_gather_into_tensor", "_all_gather_base")


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.slow(20)
def test_every_collective_is_bitwise_gloo_and_the_flat_gather_keeps_rank_order(world_size):
    gloo = collective_ranks.run(world_size, "gloo")
    contract = collective_ranks.run(world_size, NAME)
    assert {r["backend_name"] for r in gloo} == {"gloo"}
    assert {r["backend_name"] for r in contract} == {NAME}  # what torch's SyncBatchNorm branches on
    for rank, (g, c) in enumerate(zip(gloo, contract)):
        keys = sorted(k for k in g if k != "backend_name")
        assert keys == sorted(k for k in c if k != "backend_name")
        assert any(k.startswith(FLAT) for k in keys)
        for key in keys:
            assert g[key].dtype == c[key].dtype and g[key].numel() == c[key].numel(), key
            assert bits(g[key]) == bits(c[key]), f"rank {rank}: {key} differs between gloo and {NAME}"
        for key in keys:
            if key.startswith(FLAT) and ".sub." not in key:
                dtype = key.rsplit(".", 1)[1]
                rows = c[f"all_gather.{dtype}"]
                assert torch.equal(c[key].view(world_size, -1), rows), f"{key}: slice r is not rank r's input"


def test_the_flat_gather_refuses_what_nccl_refuses():
    x = torch.zeros(5)
    with pytest.raises(ValueError, match=r"world_size \(2\) times the input's 5 elements.*holds 9"):
        _flat_views(torch.empty(9), x, 2)
    with pytest.raises(TypeError, match="output torch.float16, input torch.float32"):
        _flat_views(torch.empty(10, dtype=torch.float16), x, 2)
    with pytest.raises(ValueError, match="contiguous"):
        _flat_views(torch.empty(10, 2)[:, 0], x, 2)
    views = _flat_views(torch.empty(1, 10), x, 2)  # any shape of the right size, as NCCL takes it
    assert [tuple(v.shape) for v in views] == [(5,), (5,)]
    empty = _flat_views(torch.empty(0), torch.zeros(0), 3)
    assert [v.numel() for v in empty] == [0, 0, 0]


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile needs torch >= 2.0")
@pytest.mark.slow(13)
def test_compiled_cases_run_over_the_contract_backend_as_over_gloo():
    """torch.compile over an nccl-contract group: dynamo asks the group its name and must not trace into its
    Python collectives (a C++ group is opaque to it); the case then passes as it does over gloo."""
    from harness import catalog
    from harness.engine.session import RunOptions, resolve_impls, run_selection
    from harness.judge.status import Status

    case = "compile/layer/eager/breaks-allowed/auto-dynamic/ws2"
    for backend in ("gloo", NAME):
        [record] = run_selection(catalog.select([case]), resolve_impls(["reference"]),
                                 RunOptions(backend=backend, timeout=300, diagnose=False))
        assert record.status == Status.PASS, f"{backend}: {record.message}"


def test_the_contract_backend_is_offered_for_cuda_tensors_too():
    """On a one-GPU machine it is torch's only non-gloo path (NCCL refuses two ranks on one GPU), so a CUDA run
    takes its cases rather than calling them unsupported; torch gets the backend for both device types."""
    import torch.distributed as dist

    from harness import catalog
    from harness.engine import nccl_contract
    from harness.scenarios import unsupported_reason
    from harness.selection import Selection

    assert Selection(device="cuda", backend=NAME).run_options().backend == NAME  # no usage error
    twins = [c for c in catalog.select() if c.backend == NAME]
    assert twins and all(c.id.endswith(f"/{NAME}") for c in twins)
    from harness.impls import resolve_impls

    torch_impl = resolve_impls(["torch"])[0]
    assert all(unsupported_reason(c, torch_impl, "cuda", "gloo") is None for c in twins)
    nccl_contract.register()
    assert dist.Backend.backend_capability[NAME] == ["cpu", "cuda"]
