"""Admission with scripted implementations: which (case, impl) runs, and why the others do not, in the order the
rule states (unavailable, unsupported by the implementation or the scenario, one backend, too few GPUs)."""

from __future__ import annotations

from typing import Optional

import pytest

from harness import catalog
from harness.engine.admission import Refusal, gpu_shortage, refusal, task_for, unavailable
from harness.errors import ImplUnavailable
from harness.judge.status import Status
from harness.selection import RunOptions

LAYER = "allgather-shape/even-4-4/float32-float32/contiguous/ws2"
OWN_BACKEND = "allgather-shape/even-4-4/float32-float32/contiguous/ws2/nccl-contract"
CUDA_GRAPH = "cuda-graph/even/ws2"
NO_GROUP = "no-group/layer/default/float32/2d/ws1/no-group"


class Scripted:
    """An implementation whose availability and support are given."""

    def __init__(self, name: str, missing: Optional[str] = None, unsupported: Optional[str] = None):
        self.name, self.key, self.missing, self.unsupported = name, name, missing, unsupported

    def check_available_on(self, device: str) -> None:
        if self.missing:
            raise ImplUnavailable(self.missing)

    def unsupported_reason(self, case, device: str) -> Optional[str]:
        return self.unsupported


def case(case_id: str):
    [c] = catalog.select([case_id], exhaustive=True)
    return c


def test_unavailable_names_each_implementation_that_cannot_run_and_why():
    impls = [Scripted("here"), Scripted("absent", missing="not installed: pip install absent")]
    assert unavailable(impls, "cpu", cuda_available=False) == {"absent": "not installed: pip install absent"}
    # No CUDA device: every implementation is unavailable on cuda, an implementation's own reason first.
    assert unavailable(impls, "cuda", cuda_available=False) == {"here": "no CUDA device on this machine",
                                                                "absent": "not installed: pip install absent"}


@pytest.mark.parametrize("impl, case_id, opts, kwargs, expected", [
    (Scripted("ok"), LAYER, RunOptions(), {"gpus": None}, None),
    # 1. unavailable comes first, whatever else holds
    (Scripted("gone", unsupported="momentum=None"), LAYER, RunOptions(), {"gpus": None},
     Refusal(Status.SKIPPED, "missing here")),
    # 2. the implementation's own refusal, then the scenario's
    (Scripted("narrow", unsupported="input dtype float64"), LAYER, RunOptions(), {"gpus": None},
     Refusal(Status.UNSUPPORTED, "input dtype float64")),
    (Scripted("ok"), CUDA_GRAPH, RunOptions(device="cpu"), {"gpus": None}, "unsupported"),
    # 3. torchrun has one backend: a case naming its own cannot run there, and the reason says what to do
    (Scripted("ok"), OWN_BACKEND, RunOptions(), {"gpus": None, "one_backend": True}, "unsupported"),
    (Scripted("ok"), OWN_BACKEND, RunOptions(), {"gpus": None}, None),
    (Scripted("ok"), NO_GROUP, RunOptions(), {"gpus": None, "one_backend": True}, "unsupported"),
    (Scripted("ok"), NO_GROUP, RunOptions(), {"gpus": None}, None),
    # 4. nccl wants a GPU per rank (the local pool only: gpus=None is torchrun's agents' business)
    (Scripted("ok"), LAYER, RunOptions(device="cuda"), {"gpus": 1},
     Refusal(Status.SKIPPED, gpu_shortage("cuda", "nccl", 2, 1))),
    (Scripted("ok"), LAYER, RunOptions(device="cuda", backend="gloo"), {"gpus": 1}, None),
    (Scripted("ok"), LAYER, RunOptions(device="cuda"), {"gpus": None}, None),
])
def test_refusal_follows_the_stated_order(impl, case_id, opts, kwargs, expected):
    missing = {"gone": "missing here"}
    got = refusal(case(case_id), impl, opts, missing, **kwargs)
    if isinstance(expected, str):
        assert got is not None and got.status is Status(expected) and got.reason, got
    else:
        assert got == expected
    if case_id == OWN_BACKEND and got is not None:
        assert "--backend nccl-contract" in got.reason and "without torchrun" in got.reason
    if case_id == NO_GROUP and got is not None:  # no --backend makes a process group-less run
        assert "--backend" not in got.reason and "without torchrun" in got.reason


def test_gpu_shortage_is_about_nccl_on_cuda_only():
    assert gpu_shortage("cuda", "nccl", 4, 2).startswith("nccl needs one GPU per rank: 2 visible")
    assert gpu_shortage("cuda", "nccl", 2, 2) is None
    assert gpu_shortage("cuda", "gloo", 4, 1) is None
    assert gpu_shortage("cpu", "gloo", 4, 0) is None


def test_the_task_carries_the_comparison_only_for_its_first_implementation():
    c = case(LAYER)
    opts = RunOptions(compare=("a", "b"))
    assert task_for(c, Scripted("a"), opts).compare == "b"
    assert task_for(c, Scripted("b"), opts).compare is None
    task = task_for(c, Scripted("a"), RunOptions(device="cpu"))
    assert (task.case, task.impl, task.device, task.compare) == (c.to_dict(), "a", "cpu", None)
