"""The adapters of maintained SyncBN code: detectron2, detectron2-n, timm-layer, mmengine, lightning (and
lightning-trainer).

Design: each adapter runs one or two real multi-process cases (gloo on CPU,
through the engine, as ``run`` does) where its package imports, and skips
saying why where it does not: CI installs detectron2-layers and lightning
(the test extras, for the findings files), not timm (it needs a torchvision
built for the installed torch, and a CUDA build of torch 2.14.1 is 5.5 GB)
nor mmengine (heavier than the tests should carry). What needs no package runs everywhere: registration, opt-in,
the install hint when a package is missing (made missing for real, by a
``None`` entry in ``sys.modules``, which makes its import raise), and the
reasons each adapter declares cases unsupported. The expected statuses are
what the packages do (see /work/runs/targets-report.md of 2026-11-26): a
change upstream that fixes or breaks them fails here, on purpose.
"""

from __future__ import annotations

import importlib
import sys

import pytest

from harness import catalog
from harness.catalog.case import Case
from harness.errors import ImplUnavailable
from harness.impls import resolve
from harness.impls.registry import builtin_names, default_names

NEW = ("detectron2", "detectron2-n", "timm-layer", "mmengine", "lightning", "lightning-trainer")
MISSING = {"detectron2": ("detectron2", "detectron2_layers"), "detectron2-n": ("detectron2", "detectron2_layers"),
           "timm-layer": ("timm",), "mmengine": ("mmengine",), "lightning": ("lightning",),
           "lightning-trainer": ("lightning",)}
HINT = {"detectron2": "pip install detectron2-layers", "detectron2-n": "pip install detectron2-layers",
        "timm-layer": "install timm and a torchvision", "mmengine": "pip install mmengine",
        "lightning": "pip install lightning", "lightning-trainer": "pip install lightning"}


def _importable(module: str) -> str:
    """'' when ``module`` imports here, else why not (the skip reason)."""
    try:
        importlib.import_module(module)
        return ""
    except Exception as exc:  # noqa: BLE001 - any failure to import is a reason to skip
        return f"{module} not importable here ({type(exc).__name__}: {exc})"


def _d2_reason() -> str:
    for module in ("detectron2.layers.batch_norm", "detectron2_layers.batch_norm"):
        if not _importable(module):
            return ""
    return "neither detectron2 nor detectron2-layers is importable here (pip install detectron2-layers)"


def _case(**kw) -> Case:
    base = dict(id="t/ws2", family="t", batch_sizes=(2, 2), spatial=((3, 3), (3, 3)))
    return Case(**{**base, **kw})


def _run(impl_name: str, case_ids: list[str]) -> dict:
    from harness.engine.session import RunOptions, run_selection

    return {r.case: r for r in run_selection(catalog.select(case_ids), [resolve(impl_name)], RunOptions(timeout=120))}


def test_registered_and_opt_in():
    assert set(NEW) <= set(builtin_names())
    assert not set(NEW) & set(default_names())


@pytest.mark.parametrize("name", NEW)
def test_a_missing_package_is_unavailable_with_the_install_hint(name, monkeypatch):
    for module in MISSING[name]:
        for loaded in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
            monkeypatch.delitem(sys.modules, loaded)
        monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError, as for a package not installed
    with pytest.raises(ImplUnavailable, match=HINT[name]):
        resolve(name).check_available()
    assert resolve(name).describe()["state"] == "unavailable"


@pytest.mark.parametrize("name", ("mmengine", "lightning", "lightning-trainer"))
def test_converters_run_only_the_converting_cases_of_the_whole_world(name):
    impl = resolve(name)
    layer = catalog.select(["allgather-shape/uneven-2-6/float32-float32/contiguous/ws2"])[0]
    assert "brings a converter only" in impl.unsupported_reason(layer, "cpu")
    config = catalog.select(["conversion/config/float32/uneven-3-5/ws2"])[0]
    assert impl.unsupported_reason(config, "cpu") is None
    resume = catalog.select(["conversion/checkpoint-resume-2-3/config/float32/ws3"])[0]
    assert "takes no process group" in impl.unsupported_reason(resume, "cpu")
    revert = catalog.select(["conversion/checkpoint-revert/config/float32/ws2"])[0]
    assert impl.unsupported_reason(revert, "cpu") is None
    nested, subgroups = catalog.select(["process-group/convert-nested/ws2",
                                        "process-group/convert-nested-subgroup/ws4"])
    assert impl.unsupported_reason(nested, "cpu") is None  # a layer case whose layer comes from a converted model
    assert "takes no process group" in impl.unsupported_reason(subgroups, "cpu")


def test_detectron2_declares_its_documented_limits():
    equal, by_n = resolve("detectron2"), resolve("detectron2-n")
    assert equal.unsupported_reason(_case(), "cpu") is None and by_n.unsupported_reason(_case(), "cpu") is None
    three_d = _case(spatial=((3,), (3,)))
    assert "3-D input" in equal.unsupported_reason(three_d, "cpu")
    uneven = _case(batch_sizes=(2, 5))
    assert "same (N, H, W)" in equal.unsupported_reason(uneven, "cpu")
    assert by_n.unsupported_reason(uneven, "cpu") is None
    empty = _case(batch_sizes=(0, 5), spatial=((1, 1), (3, 3)))  # an empty rank's (H, W) does not count
    assert "empty batch" in equal.unsupported_reason(empty, "cpu")
    assert by_n.unsupported_reason(empty, "cpu") is None
    sizes = _case(spatial=((3, 3), (4, 2)))
    assert "same (H, W)" in by_n.unsupported_reason(sizes, "cpu")
    groups = _case(batch_sizes=(2, 2, 2, 2), spatial=((3, 3),) * 4, groups=((0, 1), (2, 3)))
    assert "process subgroups" in by_n.unsupported_reason(groups, "cpu")
    ddp = catalog.select(["ddp/cnn-sgd/broadcast-buffers-True-default-plain/float32/ws2"])[0]
    assert by_n.unsupported_reason(ddp, "cpu") is None  # its network's norms come from build(): no conversion
    conversion = catalog.select(["conversion/config/float32/uneven-3-5/ws2"])[0]
    assert "conversion of a whole model" in by_n.unsupported_reason(conversion, "cpu")


def test_timm_layer_leaves_conversion_to_the_timm_adapter():
    nested = catalog.select(["conversion/config/float32/uneven-3-5/ws2"])[0]
    assert "conversion of a whole model" in resolve("timm-layer").unsupported_reason(nested, "cpu")
    ddp = catalog.select(["ddp/cnn-sgd/broadcast-buffers-True-default-plain/float32/ws2"])[0]
    assert resolve("timm-layer").unsupported_reason(ddp, "cpu") is None


@pytest.mark.slow
@pytest.mark.skipif(bool(_d2_reason()), reason=_d2_reason())
def test_real_detectron2_through_the_engine():
    """NaiveSyncBatchNorm's output and gradients are right; its running_var is biased, num_batches_tracked stays 0."""
    from harness.judge.status import Status

    even, uneven = ("allgather-shape/even-4-4/float32-float32/contiguous/ws2",
                    "allgather-shape/uneven-2-6/float32-float32/contiguous/ws2")
    for name in ("detectron2", "detectron2-n"):
        records = _run(name, [even, uneven])
        r = records[even]
        assert r.status == Status.MISMATCH and r.mode_notes[0] == f"stats_mode={resolve(name).stats_mode!r}"
        failing = {k.split(".", 1)[1] for k, m in r.metrics.items() if not m.ok}
        assert failing == {"step0.train.running_var", "step0.train.num_batches_tracked"}, r.message
    assert _run("detectron2", [uneven])[uneven].status == Status.UNSUPPORTED


@pytest.mark.slow
@pytest.mark.skipif(bool(_importable("timm.layers")), reason=_importable("timm.layers"))
def test_real_timm_layer_through_the_engine():
    from harness.judge.status import Status

    case = "allgather-shape/uneven-2-6/float32-float32/contiguous/ws2"
    r = _run("timm-layer", [case])[case]
    assert r.status == Status.PASS, r.message
    assert r.impl_version.startswith("timm ")


@pytest.mark.slow
@pytest.mark.parametrize("name,frozen", [("mmengine", "mismatch"), ("lightning", "pass")])
def test_real_converters_through_the_engine(name, frozen):
    """mmengine's converter drops a frozen layer's eval mode (torch's did before 2.2); Lightning's is torch's."""
    reason = _importable({"mmengine": "mmengine.model", "lightning": "lightning.pytorch.plugins"}[name])
    if reason:
        pytest.skip(reason)
    config, frozen_case = "conversion/config/float32/uneven-3-5/ws2", "conversion/frozen/float64/uneven-3-5/ws2"
    records = _run(name, [config, frozen_case])
    assert records[config].status.value == "pass", records[config].message
    assert records[frozen_case].status.value == frozen, records[frozen_case].message
    if frozen == "mismatch":
        assert "training=True after conversion, was False" in records[frozen_case].message


@pytest.mark.parametrize("name", ("mmengine", "lightning"))
def test_revert_keeps_names_and_tensors(name):
    """The revert functions give plain BatchNorms under the same names, sharing the SyncBatchNorms' tensors."""
    import torch

    from harness.scenarios import user_models

    reason = _importable({"mmengine": "mmengine.model", "lightning": "lightning.pytorch.plugins"}[name])
    if reason:
        pytest.skip(reason)
    if name == "mmengine":
        from mmengine.model import revert_sync_batchnorm as revert
    else:
        from lightning.pytorch.plugins import TorchSyncBatchNorm

        revert = TorchSyncBatchNorm().revert
    model = user_models.build("config", 4, 0)
    for m in model.modules():
        if type(m) is torch.nn.BatchNorm2d:
            m.__class__ = torch.nn.SyncBatchNorm  # converted in place: only the revert is under test
    tensors = {k: v.data_ptr() for k, v in model.state_dict().items()}
    back = revert(model)
    assert not any(isinstance(m, torch.nn.SyncBatchNorm) for m in back.modules())
    assert {k: v.data_ptr() for k, v in back.state_dict().items()} == tensors


def test_repro_bindings():
    """Standalone files bind SyncBatchNorm to timm's layer and detectron2's class; converters have none."""
    import ast

    assert all(resolve(name).repro_binding() is None for name in ("timm", "mmengine", "lightning"))
    timm = resolve("timm-layer").repro_binding()
    assert timm.library == "timm" and timm.on_cuda and "SyncBatchNormAct" in timm.code
    ast.parse(timm.code)
    if _d2_reason():
        return  # detectron2's binding names the module that is importable here
    for name, mode in (("detectron2", "''"), ("detectron2-n", "'N'")):
        d2 = resolve(name).repro_binding()
        ast.parse(d2.code)
        assert f"stats_mode={mode}" in d2.code and not d2.on_cuda
