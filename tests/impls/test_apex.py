"""The apex adapter in each of apex's states, with real imports, and the real apex where it is installed.

Design: apex is not on the package index, so CI has none. Each state is made
real by writing a small package named ``apex`` (and, where a state needs it,
a ``syncbn`` module) to ``tmp_path`` and putting it first on ``sys.path`` (in
this process) or ``PYTHONPATH`` (for a ``syncbn-harness`` subprocess). The
``apex.parallel`` of these packages chooses its class exactly as apex's own
``apex/parallel/__init__.py`` does (``import syncbn`` or fall back, keeping
the error), so the adapter's detection meets the same code paths as with the
real apex. Nothing of the adapter is mocked.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import textwrap
from pathlib import Path

import pytest
from cli_here import run_here
import torch

from harness.buildinfo import apex_state
from harness.impls import resolve
from harness.impls.apex import ApexImpl, probe
from harness.judge.mode import Mode

CASE = "allgather-shape/even-4-4/float32-float32/contiguous/ws2"

# apex/parallel/__init__.py as apex shipped it before PR #1896, reduced to what decides the state.
PARALLEL_INIT = '''
try:
    import syncbn
    from .optimized_sync_batchnorm import SyncBatchNorm
except ImportError as err:
    from .sync_batchnorm import SyncBatchNorm
    SyncBatchNorm.syncbn_import_error = err


def convert_syncbn_model(module, process_group=None, channel_last=False):
    """Every BatchNorm of ``module`` becomes SyncBatchNorm (stand-in: shares parameters and buffers)."""
    import torch

    if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
        new = SyncBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                            module.track_running_stats, process_group)
        if module.affine:
            new.weight, new.bias = module.weight, module.bias
        if module.track_running_stats:
            new.running_mean, new.running_var = module.running_mean, module.running_var
            new.num_batches_tracked = module.num_batches_tracked
        new.train(module.training)
        return new
    for name, child in module.named_children():
        module.add_module(name, convert_syncbn_model(child, process_group, channel_last))
    return module
'''
FALLBACK = '''
import torch
import torch.distributed as dist
from torch.distributed.nn.functional import all_reduce


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """Stand-in for apex's Python fallback: its constructor and its NVTX marks; a correct float64 SyncBN inside."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 process_group=None, channel_last=False):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_group = process_group

    def forward(self, x):
        torch.cuda.nvtx.range_push("sync_bn_fw_with_mean_var")  # as apex marks its forward: needs NVTX
        try:
            return self._forward(x)
        finally:
            torch.cuda.nvtx.range_pop()

    def _forward(self, x):
        dims = [0] + list(range(2, x.dim()))
        shape = [1, -1] + [1] * (x.dim() - 2)
        xd = x.double()
        if not self.training and self.track_running_stats:
            mean, var = self.running_mean.double(), self.running_var.double()
        else:
            c = x.shape[1]
            group = self.process_group or dist.group.WORLD
            n = torch.full((1,), x.numel() / c, dtype=torch.float64)
            s = all_reduce(torch.cat([n, xd.sum(dims)]), group=group) if self.training else torch.cat([n, xd.sum(dims)])
            count, mean = s[0], s[1:] / s[0]
            sq = ((xd - mean.view(shape)) ** 2).sum(dims)
            var = (all_reduce(sq, group=group) if self.training else sq) / count
            if self.training and self.track_running_stats:
                with torch.no_grad():
                    self.num_batches_tracked += 1
                    f = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
                    unbiased = var * count / (count - 1)
                    self.running_mean.copy_((1 - f) * self.running_mean.double() + f * mean.detach())
                    self.running_var.copy_((1 - f) * self.running_var.double() + f * unbiased.detach())
        y = (xd - mean.view(shape)) / torch.sqrt(var.view(shape) + self.eps)
        if self.affine:
            y = y * self.weight.double().view(shape) + self.bias.double().view(shape)
        return y.to(x.dtype)
'''
OPTIMIZED = '''
import torch
import torch.nn.functional as F

import syncbn  # noqa: F401  (as apex's optimized module does)


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """Stand-in: with channel_last=True the channel is the LAST dimension, as in apex's syncbn kernels."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 process_group=None, channel_last=False, fuse_relu=False):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_group = process_group
        self.channel_last = channel_last
        self.seen = []

    def _specify_channel_last(self, channel_last):
        self.channel_last = channel_last

    def forward(self, input):
        self.seen.append((tuple(input.shape), input.is_contiguous(), self.channel_last))
        x = input.movedim(-1, 1) if self.channel_last else input
        y = F.batch_norm(x, None, None, self.weight, self.bias, True, 0.0, self.eps)
        return y.movedim(1, -1).contiguous() if self.channel_last else y.contiguous()
'''


def _is_apex(name: str) -> bool:
    return name == "syncbn" or name == "apex" or name.startswith("apex.")


@pytest.fixture
def site(tmp_path):
    """Write a package tree to tmp_path/site, put it first on sys.path; restore sys.path and sys.modules after."""
    root = tmp_path / "site"
    saved_modules = {k: v for k, v in sys.modules.items() if _is_apex(k)}
    saved_path = list(sys.path)

    def make(files: dict[str, str]) -> Path:
        for rel, text in files.items():
            p = root / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(textwrap.dedent(text))
        for k in [k for k in sys.modules if _is_apex(k)]:
            del sys.modules[k]
        sys.path.insert(0, str(root))
        importlib.invalidate_caches()
        return root

    yield make
    for k in [k for k in sys.modules if _is_apex(k)]:
        del sys.modules[k]
    sys.modules.update(saved_modules)
    sys.path[:] = saved_path
    importlib.invalidate_caches()


def _run_cli(*args: str, pythonpath: Path | None = None) -> tuple[int, list[dict], str]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), env.get("PYTHONPATH")]))
    proc = run_here(["run", *args, "--format", "json"], env=env)  # in this process (tests/support/cli_here.py)
    records = json.loads(proc.stdout) if proc.stdout.strip() else []
    return proc.returncode, records, proc.stderr


def _real_apex_importable() -> bool:
    try:
        return importlib.util.find_spec("apex") is not None
    except (ImportError, ValueError):
        return False


@pytest.mark.skipif(_real_apex_importable(),
                    reason="apex is installed here: the absent state is tested where it is not")
def test_absent_apex_is_reported_and_its_records_are_skipped():
    assert apex_state().startswith("not installed")
    assert "PR #1896" in apex_state()
    code, records, err = _run_cli("--impl", "apex", "--case", CASE)
    assert code == 0, err
    assert [r["status"] for r in records] == ["skipped"]
    assert records[0]["impl"] == "apex" and "not installed" in records[0]["message"]


def test_apex_without_parallel_is_the_pr_1896_state(site):
    root = site({"apex/__init__.py": '__version__ = "0.1"\n', "apex/normalization/__init__.py": ""})
    assert probe().kind == "removed"
    assert "without apex.parallel" in apex_state() and "PR #1896" in apex_state()
    assert ApexImpl().describe()["state"] == "unavailable"
    code, records, err = _run_cli("--impl", "apex", "--case", CASE, pythonpath=root)
    assert code == 0, err
    assert [r["status"] for r in records] == ["skipped"]
    assert "without apex.parallel" in records[0]["message"] and "PR #1896" in records[0]["message"]


def test_apex_that_fails_to_import_says_why(site):
    site({"apex/__init__.py": 'raise ImportError("cannot import name \'_six\' from \'torch\'")\n'})
    state = apex_state()
    assert probe().kind == "broken" and "import apex" in state and "_six" in state


@pytest.mark.skipif(_real_apex_importable(),
                    reason="apex is installed here, and an installed package wins over a bare directory")
def test_a_bare_apex_directory_is_not_taken_for_apex(site):
    root = site({"apex/README.md": "an unpacked source tree's folder, no __init__.py\n"})
    assert probe().kind == "broken" and str(root / "apex") in apex_state()


def test_python_fallback_state_keeps_apexs_import_error(site):
    site({"apex/__init__.py": "from . import parallel\n", "apex/parallel/__init__.py": PARALLEL_INIT,
          "apex/parallel/sync_batchnorm.py": FALLBACK})
    assert probe().kind == "fallback"
    assert "Python fallback" in apex_state() and "No module named 'syncbn'" in apex_state()
    impl = resolve("apex")
    assert impl.mode is Mode.PYTHON_FALLBACK
    assert impl.mode_notes == (() if hasattr(torch._C, "_nvtx") else ("nvtx no-op",))
    assert "cpu" in impl.capabilities.devices


def test_a_syncbn_that_fails_to_load_is_the_fallback_not_the_optimized_path(site):
    """A findable but broken extension: apex falls back, and so must the reported state."""
    site({"apex/__init__.py": "from . import parallel\n", "apex/parallel/__init__.py": PARALLEL_INIT,
          "apex/parallel/sync_batchnorm.py": FALLBACK,
          "syncbn.py": 'raise ImportError("syncbn.so: undefined symbol: _ZN3c10")\n'})
    assert probe().kind == "fallback"
    assert "undefined symbol" in apex_state()


@pytest.mark.slow(12)
def test_optimized_state_is_cuda_only_and_unsupported_on_cpu(site):
    root = site({"apex/__init__.py": "from . import parallel\n", "apex/parallel/__init__.py": PARALLEL_INIT,
                 "apex/parallel/sync_batchnorm.py": FALLBACK,
                 "apex/parallel/optimized_sync_batchnorm.py": OPTIMIZED, "syncbn.py": ""})
    assert probe().kind == "optimized"
    assert "optimized CUDA extension" in apex_state() and "syncbn.py" in apex_state()
    impl = resolve("apex")
    assert impl.mode == "optimized"
    assert impl.capabilities.devices == frozenset({"cuda"})
    assert impl.capabilities.dtypes == frozenset({"float16", "float32"})
    code, records, err = _run_cli("--impl", "apex", "--case", CASE, "--device", "cpu", pythonpath=root)
    assert code == 0, err
    assert [r["status"] for r in records] == ["unsupported"]
    assert "device cpu" in records[0]["message"] and records[0]["mode"] == "optimized"


@pytest.mark.parametrize("fmt,shape", [(torch.channels_last, (2, 3, 4, 5)), (torch.channels_last_3d, (2, 3, 2, 4, 5))])
def test_optimized_gets_channels_last_input_as_its_nhwc_view(site, fmt, shape):
    """apex's channel_last=True wants the channel last in the SHAPE; the adapter hands over that view."""
    site({"apex/__init__.py": "from . import parallel\n", "apex/parallel/__init__.py": PARALLEL_INIT,
          "apex/parallel/sync_batchnorm.py": FALLBACK,
          "apex/parallel/optimized_sync_batchnorm.py": OPTIMIZED, "syncbn.py": ""})
    from apex.parallel import SyncBatchNorm

    impl = ApexImpl()
    module = SyncBatchNorm(3)
    x = torch.randn(*shape).to(memory_format=fmt)
    y = impl.forward(module, x)
    nhwc = (shape[0], *shape[2:], shape[1])
    assert module.seen == [(nhwc, True, True)]
    assert y.shape == x.shape and y.is_contiguous(memory_format=fmt)
    torch.testing.assert_close(y, torch.nn.functional.batch_norm(x, None, None, training=True))
    module.seen.clear()
    impl.forward(module, x.contiguous())
    assert module.seen == [(shape, True, False)]


STAND_IN_CASES = ["allgather-shape/uneven-2-6/float32-float32/channels_last/ws2",
                  "module-config/momentum-none-eval/ws2", "process-group/convert-nested/ws2",
                  "process-group/pairs-01-23/ws4", "channels-last/uneven/channels_last/ws2"]


@pytest.mark.slow(13)
def test_the_adapter_builds_converts_and_runs_an_apex_shaped_package(site):
    """apex itself cannot be installed here (it is not on the package index and its build needs a CUDA build of
    torch), so the adapter's build (apex's positional constructor), convert (``convert_syncbn_model``),
    forward and CPU set-up (NVTX made a no-op on a CPU-only torch) run against a stand-in package of apex's
    shape whose SyncBatchNorm is correct: every case must pass through the adapter."""
    root = site({"apex/__init__.py": "from . import parallel\n", "apex/parallel/__init__.py": PARALLEL_INIT,
                 "apex/parallel/sync_batchnorm.py": FALLBACK})
    assert probe().kind == "fallback"
    code, records, err = _run_cli("--impl", "apex", *[a for c in STAND_IN_CASES for a in ("--case", c)],
                                  "--device", "cpu", pythonpath=root)
    assert code == 0, err[-3000:]
    assert sorted(r["case"] for r in records) == sorted(STAND_IN_CASES)
    assert {r["status"] for r in records} == {"pass"}, [(r["case"], r["message"]) for r in records]
    notes = [] if hasattr(torch._C, "_nvtx") else ["nvtx no-op"]
    assert {(r["mode"], tuple(r["mode_notes"])) for r in records} == {("python-fallback", tuple(notes))}
    nested = next(r for r in records if r["case"] == "process-group/convert-nested/ws2")
    assert not [m for m in nested["metrics"] if m.split(".", 1)[1].startswith("convert")]  # converted faithfully


REAL_APEX_REASON = ("" if probe().kind in ("fallback", "optimized")
                    else "apex.parallel is not importable here: " + probe().text)


@pytest.mark.skipif(bool(REAL_APEX_REASON), reason=REAL_APEX_REASON)
def test_real_apex_through_the_engine():
    """The installed apex, as it is: what it gets right passes, its known defects stay failures."""
    from harness import catalog
    from harness.engine.session import RunOptions, run_selection
    from harness.judge.status import Status

    cases = {"even": CASE, "uneven": "module-config/affine-off/ws2",
             "momentum-none": "module-config/momentum-none-3-steps/ws2"}
    impl = resolve("apex")
    records = {r.case: r for r in run_selection(catalog.select(list(cases.values())), [impl],
                                                         RunOptions(timeout=120))}
    if probe().kind == "optimized":  # the CUDA extension: CPU cases are unsupported, with the reason
        assert {r.status for r in records.values()} == {Status.UNSUPPORTED}
        return
    even, uneven, mom = (records[cases[k]] for k in ("even", "uneven", "momentum-none"))
    assert even.status == Status.PASS, even.message
    assert even.mode == impl.mode and even.mode.startswith("python-fallback")
    # apex's fallback averages per-rank means without weighting by count: wrong for uneven batches.
    assert uneven.status == Status.MISMATCH and "running_mean" in uneven.message, uneven.message
    # momentum=None (documented by apex) reaches `None * mean` in its forward.
    assert mom.status == Status.ERROR and "TypeError" in mom.message, mom.message
