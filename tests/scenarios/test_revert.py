"""The revert scenario: an implementation's own revert of a converted, trained model to BatchNorm.

What the reverted model must be is said by :func:`revert_problems`, checked
here in one process on the reference's revert (it keeps everything: the same
objects under their original classes) and on Lightning's real one (it loses a
frozen layer's eval mode). Through the real engine: the reference passes the
revert cases, torch (no revert) and apex report them unsupported with the
reason, Lightning fails the frozen ones as a known issue and passes the rest.
The planted revert defects (tests/support/converters.py: training flag,
requires_grad, bias=False lost) run in tests/scenarios/test_conversion.py.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from harness import catalog
from harness.engine.session import RunOptions, resolve_impls, run_selection
from harness.impls.reference import SyncBatchNorm
from harness.judge.status import Status
from harness.scenarios import user_models
from harness.scenarios.conversion import _snapshot
from harness.scenarios.revert import before_revert, revert_problems

MODELS = ("frozen", "config", "no-bias", "nested", "bn-act", "other-norms")


def _lightning_reason() -> str:
    try:
        importlib.import_module("lightning.pytorch.plugins")
        return ""
    except Exception as exc:  # noqa: BLE001 - any failure to import is the reason to skip
        return f"lightning not importable here ({type(exc).__name__}: {exc})"


def _converted(name: str, convert=SyncBatchNorm.convert_sync_batchnorm):
    model = user_models.build(name, 4, seed=2)
    model.train()
    norms = _snapshot(model)["norms"]
    converted = convert(model)
    return converted, before_revert(converted, norms)


@pytest.mark.parametrize("name", MODELS)
def test_the_reference_revert_gives_back_the_batchnorm_model(name):
    converted, kept = _converted(name)
    layers = {n: m for n, m in converted.named_modules() if isinstance(m, SyncBatchNorm)}
    reverted = SyncBatchNorm.revert_sync_batchnorm(converted)
    assert revert_problems(kept, reverted) == []
    plain = dict(user_models.build(name, 4, seed=2).named_modules())
    for n, layer in layers.items():  # the same objects, under the classes they were built with
        assert reverted.get_submodule(n) is layer and type(layer) is type(plain[n]), n
        assert not hasattr(layer, "process_group")


def test_what_a_revert_gets_wrong_is_said_in_a_sentence():
    converted, kept = _converted("frozen")
    reverted = SyncBatchNorm.revert_sync_batchnorm(converted)
    reverted.frozen.train()  # a revert that leaves every layer in training mode
    reverted.frozen.weight.requires_grad_(True)  # one that makes frozen parameters trainable again
    with torch.no_grad():
        reverted.head[1].running_mean.add_(1)  # one that loses the statistics trained before it
    assert revert_problems(kept, reverted) == [
        "frozen: training=True after revert, was False",
        "parameter frozen.weight: requires_grad=True after revert, was False",
        "buffer head.1.running_mean changed in the revert"]
    converted, kept = _converted("no-bias")
    reverted = SyncBatchNorm.revert_sync_batchnorm(converted)
    reverted[1] = torch.nn.BatchNorm2d(4, affine=False)  # the weight of a layer without bias lost with affine
    reverted[3] = torch.nn.SyncBatchNorm(4)  # still synchronizing
    problems = revert_problems(kept, reverted)
    assert problems[:3] == ["3 is SyncBatchNorm after revert, not a BatchNorm",
                            "1: affine=False after revert, was True", "parameter 1.weight is missing after revert"]
    reverted[1] = torch.nn.BatchNorm2d(4)  # a bias where bias=False had none
    assert "1: bias=True after revert, was False" in revert_problems(kept, reverted)


@pytest.mark.skipif(bool(_lightning_reason()), reason=_lightning_reason())
def test_lightnings_revert_loses_the_frozen_layers_eval_mode_and_nothing_else():
    from lightning.pytorch.plugins import TorchSyncBatchNorm

    for name in ("frozen", "config", "no-bias"):
        converted, kept = _converted(name, torch.nn.SyncBatchNorm.convert_sync_batchnorm)
        problems = revert_problems(kept, TorchSyncBatchNorm().revert(converted))
        assert problems == (["frozen: training=True after revert, was False"] if name == "frozen" else []), name


@pytest.mark.slow(12)
def test_through_the_engine_each_implementations_own_revert_or_the_reason_it_has_none():
    cases = catalog.select(["conversion/revert/*"])
    assert {c.model for c in cases} == {"frozen", "config", "no-bias"} and len(cases) == 6
    names = ["reference", "torch", "apex"] + ([] if _lightning_reason() else ["lightning"])
    records = list(run_selection(cases, resolve_impls(names), RunOptions(timeout=60, diagnose=False)))
    by = {(r.impl, r.case): r for r in records}
    for case in cases:
        assert by[("reference", case.id)].status is Status.PASS, by[("reference", case.id)].message
        torch_record = by[("torch", case.id)]
        assert torch_record.status is Status.UNSUPPORTED and "it has no revert" in torch_record.message
        assert by[("apex", case.id)].status in (Status.SKIPPED, Status.UNSUPPORTED)
        if "lightning" not in names:
            continue
        r = by[("lightning", case.id)]
        if case.model == "frozen":
            assert r.status is Status.MISMATCH and r.known, r.message
            assert "training=True after revert, was False" in r.message
        else:
            assert r.status is Status.PASS, r.message
