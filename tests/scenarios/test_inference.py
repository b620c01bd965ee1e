"""The no-group and inference families, run for real: correct SyncBNs pass, planted defects are caught.

Design: real rank processes through :func:`harness.engine.session.run_selection`: a pool whose one rank never
initializes ``torch.distributed`` (``Case.backend == "no-group"``), and pools of two and three ranks over gloo
whose trained models are then evaluated, traced and exported on CPU as shipped. The planted defects are the
textbook SyncBN with one upstream defect each (tests/support/inference_defects.py), and torch's own batchnorm.py
copied with a device check put back at the top of ``forward``, as torch had it before (a ``torch@PATH`` copy): on
CPU its training passes only because cpu-emulation answers that check, so its inference must fail as shipped.
"""

from __future__ import annotations

import fnmatch
import shutil
from pathlib import Path

import pytest
import torch
from inference_defects import CAUGHT_BY

from harness import catalog
from harness.catalog.case import NO_GROUP, Case
from harness.engine import forkserver
from harness.engine.session import RunOptions, resolve_impls, run_selection
from harness.judge.mode import Mode
from harness.judge.status import Status
from harness.scenarios import inference

FAMILIES = ["no-group/*", "inference/*"]
# What torch's forward asked before the fallback of pytorch#89706 (and 1.x releases: in every mode); added at the
# top of a copy's forward. cpu-emulation answers the privateuse1 lookup with "cpu" in training steps only.
DEVICE_CHECK = ("        if input.device.type not in ('cuda', torch._C._get_privateuse1_backend_name()):\n"
                "            raise ValueError('SyncBatchNorm expected input tensor to be on GPU')\n")


def test_a_case_without_a_process_group_has_one_rank_and_inference_comes_last():
    one = dict(family="no-group", spatial=((2,),), backend=NO_GROUP)
    Case(id="no-group/x/ws1/no-group", batch_sizes=(3,), **one)
    with pytest.raises(ValueError, match="one rank"):
        Case(id="no-group/x/ws2/no-group", batch_sizes=(3, 3), family="no-group", spatial=((2,),) * 2,
             backend=NO_GROUP)
    late = Case(id="inference/x/ws2", family="inference", batch_sizes=(3, 3), spatial=((2,),) * 2,
                steps=("train", "eval", "train"), scenario="inference", model="config")
    assert "after every training step" in inference.unsupported_reason(late, None, "cpu", "gloo")
    x = torch.arange(12.0).view(3, 4)
    assert inference.second_batch(x).shape == x.shape and not torch.equal(inference.second_batch(x), x)


def _run(specs: list, cases: list) -> tuple[dict, dict]:
    """Every (impl name, case) record of ``specs`` on ``cases``, and each spec's impl name. The forkserver, where
    this process has none yet, preloads dynamo (``torch.export``), as a command selecting these cases does."""
    forkserver.prewarm(dynamo=True)
    impls = resolve_impls(specs)
    records = run_selection(cases, impls, RunOptions(timeout=120, diagnose=False))
    return {(r.impl, r.case): r for r in records}, {spec: impl.name for spec, impl in zip(specs, impls)}


@pytest.mark.slow(15)
def test_torch_passes_with_no_process_group_and_at_inference():
    """torch on every default case of both families (the reference's run in tests/commands/test_cli.py's run of the
    whole default selection): natively without a group, through cpu-emulation where it trains over one."""
    cases = catalog.select(FAMILIES)
    assert {c.family for c in cases} == {"no-group", "inference"} and all(
        c.backend == NO_GROUP for c in cases if c.family == "no-group")
    records, _ = _run(["torch"], cases)
    assert len(records) == len(cases)
    bad = [f"{impl} {case}: {r.status.value} {r.message}" for (impl, case), r in records.items()
           if r.status is not Status.PASS]
    assert not bad, "\n".join(bad)
    for (_, case), r in records.items():
        assert r.mode is (Mode.NATIVE if case.startswith("no-group/") else Mode.CPU_EMULATION), (case, r.mode)
        assert not (case.startswith("no-group/") and any(o.collectives for o in r.ranks)), case
        if "/model/" in case or case.startswith("inference/"):  # every program judged on both batches
            names = {k.split(".", 2)[2] for k in r.metrics if ".step2.eval." in k}
            assert {"eval.output", "eval.output.second_batch", "eval.trace.output", "eval.export.output",
                    "eval.trace.output.second_batch", "eval.export.output.second_batch"} <= names, (case, names)


def _copy_with_device_check(folder: Path) -> Path:
    """torch's batchnorm.py as installed, under ``folder``/torch/nn/modules, with :data:`DEVICE_CHECK` first in
    SyncBatchNorm's forward."""
    dest = folder / "torch" / "nn" / "modules"
    dest.mkdir(parents=True)
    text = Path(torch.nn.modules.batchnorm.__file__).read_text()
    anchor = "        self._check_non_zero_input_channels(input)\n"
    assert text.count(anchor) == 1, "this copy was written for torch 2.13's batchnorm.py"
    (dest / "batchnorm.py").write_text(text.replace(anchor, anchor + DEVICE_CHECK))
    shutil.copyfile(Path(torch.nn.modules.batchnorm.__file__).parent / "_functions.py", dest / "_functions.py")
    return folder


@pytest.mark.slow(15)
@pytest.mark.usefixtures("support_on_path")
def test_each_planted_defect_fails_where_it_should_and_nowhere_else(tmp_path):
    copy = f"torch@{_copy_with_device_check(tmp_path / 'checkout')}"
    cases = catalog.select(["no-group/layer/default/float32/2d/ws1/no-group", "no-group/model/config/float32/*",
                            "no-group/model/no-running-stats/float32/*", "inference/config/float32/uneven-3-5/ws2",
                            "inference/no-running-stats/float32/uneven-3-5/ws2"])
    assert len(cases) == 5
    caught = {**{f"inference_defects:{n}": v for n, v in CAUGHT_BY.items()}, copy: (("inference/*",), "error")}
    records, names = _run(list(caught), cases)
    expected = {names[spec]: v for spec, v in caught.items()}
    wrong = []
    for (impl, case), r in records.items():
        patterns, status = expected[impl]
        want = status if any(fnmatch.fnmatch(case, p) for p in patterns) else "pass"
        if impl == names[copy] and case.startswith("no-group/"):
            want = "error"  # no group, no emulation: the copy refuses CPU input in training too, as shipped
        if r.status.value != want:
            wrong.append(f"{impl} {case}: {r.status.value}, expected {want}: {r.message}")
    assert not wrong, "\n".join(wrong)
    for (impl, case), r in records.items():
        if impl == names[copy] and case.startswith("inference/"):
            # Trained through cpu-emulation (every training step judged and passing), refused as shipped.
            assert "expected input tensor to be on GPU" in r.message, r.message
            assert all(m.ok for k, m in r.metrics.items() if ".train." in k) and any(".train." in k for k in r.metrics)
        if impl.endswith("HostBatchStats") and r.status is Status.MISMATCH:
            # Only the traced program is wrong, and only on the batch it was not made from.
            failing = {k.split(".", 1)[1] for k, m in r.metrics.items() if not m.ok}
            assert failing == {"step2.eval.trace.output.second_batch"}, failing
