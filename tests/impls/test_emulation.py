"""The torch CPU emulation, on the installed torch: where its kernels live, both paths, installed schemas.

Design: everything runs through the real engine (``run_selection``
with real rank processes). What a rank registers is observed from inside a
rank by a small plugin written to ``tmp_path`` (put on ``sys.path``, which
spawned ranks inherit): it diffs the aten ops that have a CPU kernel there
against the parent's list, then behaves as the
reference SyncBN so that its record passes only if every check held.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from harness import catalog
from harness.impls import torch_emulation
from harness.engine.session import RunOptions, resolve_impls, run_selection
from harness.judge.status import Status

CASES = ["allgather-shape/even-4-4/float32-float32/contiguous/ws2",
         "allgather-shape/uneven-2-6/float32-float32/channels_last/ws2",
         "allgather-shape/empty-0-5/float32-float32/channels_last_3d/ws2",
         "module-config/momentum-none-3-steps/ws2"]

PROBE = '''
"""Plugin run in rank processes: checks the dispatcher there, then is the reference SyncBN."""
import json, os
import torch
from harness.impls import torch_emulation
from harness.impls.reference import SyncBatchNorm

def _has(name):
    return torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU")


def _aten_names():
    all_names = getattr(torch._C, "_dispatch_get_all_op_names", None)  # torch >= 2.0
    if all_names is None:  # older: the five and a CUDA-only neighbour that must stay without a CPU kernel
        return ["aten::" + op for op in torch_emulation.OPS + ("batch_norm_gather_stats",)]
    return [n for n in all_names() if n.startswith("aten::")]

def make(num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True, process_group=None):
    with open(os.environ["EMULATION_PROBE_BASELINE"]) as f:
        before = set(json.load(f))
    now = {n for n in _aten_names() if _has(n)}
    added = sorted(now - before)
    want = sorted("aten::" + op for op in torch_emulation.OPS)
    if added != want or before - now:
        raise AssertionError("aten ops with a CPU kernel in the rank, beyond the parent's: " + json.dumps(added)
                             + ", expected exactly " + json.dumps(want))
    forced = os.environ.get("SYNCBN_HARNESS_TORCH_PATH")
    if forced and torch_emulation.device_check_path() != forced:
        raise AssertionError("path " + torch_emulation.device_check_path() + " in the rank, forced " + forced)
    return SyncBatchNorm(num_features, eps=eps, momentum=momentum, affine=affine,
                         track_running_stats=track_running_stats, process_group=process_group)
'''


def _aten_ops_with_cpu_kernels() -> list[str]:
    names = getattr(torch._C, "_dispatch_get_all_op_names", None)  # torch >= 2.0; see the probe for older
    names = names() if names else ["aten::" + op for op in torch_emulation.OPS + ("batch_norm_gather_stats",)]
    return sorted(n for n in names
                  if n.startswith("aten::") and torch._C._dispatch_has_kernel_for_dispatch_key(n, "CPU"))


def _cpu_kernels_here() -> dict:
    return {op: torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", "CPU") for op in torch_emulation.OPS}


@pytest.fixture
def probe_plugin(tmp_path, monkeypatch):
    (tmp_path / "emulation_probe.py").write_text(textwrap.dedent(PROBE))
    baseline = tmp_path / "aten_cpu_kernels.json"
    baseline.write_text(json.dumps(_aten_ops_with_cpu_kernels()))  # what the parent has, for the ranks to diff
    monkeypatch.setenv("EMULATION_PROBE_BASELINE", str(baseline))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "emulation_probe:make"


@pytest.mark.parametrize("path", ["module", "function"])
def test_both_paths_pass_through_the_engine_and_kernels_stay_in_the_ranks(path, probe_plugin, monkeypatch):
    if path == "module" and not hasattr(torch._C, "_get_privateuse1_backend_name"):
        pytest.skip(f"torch {torch.__version__} has no privateuse1 backend name: the module path cannot exist")
    monkeypatch.setenv("SYNCBN_HARNESS_TORCH_PATH", path)
    assert not any(_cpu_kernels_here().values()), "the test process had emulated kernels before the run"
    impls = resolve_impls(["torch", probe_plugin])
    records = list(run_selection(catalog.select(CASES), impls, RunOptions(timeout=120)))
    by_impl = {}
    for r in records:
        by_impl.setdefault(r.impl, []).append(r)
    probe = by_impl[probe_plugin]
    assert [r.status for r in probe] == [Status.PASS] * len(CASES), [r.message for r in probe]
    torch_records = by_impl["torch"]
    assert {r.mode for r in torch_records} == {"cpu-emulation"}
    assert [r.status for r in torch_records] == [Status.PASS] * len(CASES), [r.message for r in torch_records]
    assert _cpu_kernels_here() == {op: False for op in torch_emulation.OPS}, "emulated kernels leaked into the parent"


def test_arg_names_are_the_installed_schemas():
    for op in torch_emulation.OPS:
        installed = [a.name for a in getattr(torch.ops.aten, op).default._schema.arguments]
        assert torch_emulation.arg_names(op) == installed
    assert torch_emulation.arg_names("batch_norm_stats") == ["input", "eps"]
    counts = "count" in torch_emulation.arg_names("batch_norm_backward_elemt")
    assert torch_emulation.backward_takes_counts() == counts


def test_installed_schema_of_a_missing_op_names_it():
    with pytest.raises(RuntimeError, match="aten::no_such_syncbn_op"):
        torch_emulation.installed_schema("no_such_syncbn_op")


def test_the_kernel_adapter_maps_arguments_by_installed_name(kernels):
    """The CPU kernel registered for batch_norm_stats takes the installed argument names, by keyword too."""
    x = torch.randn(4, 3, 5, dtype=torch.float32)
    call = torch_emulation._kernel("batch_norm_stats")
    mean, invstd = call(input=x, eps=1e-5)
    torch.testing.assert_close(mean, x.transpose(0, 1).reshape(3, -1).mean(1))
    assert torch_emulation.unavailable_reason() is None


def test_device_check_path_reads_the_installed_module(monkeypatch):
    monkeypatch.delenv("SYNCBN_HARNESS_TORCH_PATH", raising=False)
    import inspect

    src = inspect.getsource(torch.nn.SyncBatchNorm.forward)
    expected = "module" if "_get_privateuse1_backend_name" in src else "function"
    assert torch_emulation.device_check_path() == expected
    monkeypatch.setenv("SYNCBN_HARNESS_TORCH_PATH", "function")
    assert torch_emulation.device_check_path() == "function"


DDP_GUARD = '''
import datetime

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from harness.impls import torch_emulation

store = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))
model = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 1), torch.nn.SyncBatchNorm(3))


def refused():
    try:
        DistributedDataParallel(model)
    except ValueError as e:
        return "SyncBatchNorm layers only work with GPU modules" in str(e)
    return False


assert refused(), "DDP accepted a CPU SyncBatchNorm outside the guard"
with torch_emulation.ddp_accepts_cpu_syncbn():
    wrapped = DistributedDataParallel(model)
assert isinstance(wrapped.module[1], torch.nn.SyncBatchNorm)
assert refused(), "the guard did not put DDP's check back"
del wrapped  # the reducer holds the process group: it goes first
dist.destroy_process_group()
print("ok")
'''


def test_ddp_refuses_cpu_syncbatchnorm_except_inside_the_guard():
    """DDP's CPU check is skipped only inside the guard, and the guard puts it back.

    In a process of its own: a DDP reducer left to the pytest worker's garbage collector would join
    the process group's threads after the group is gone, and hang the worker.
    """
    done = subprocess.run([sys.executable, "-c", DDP_GUARD], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
