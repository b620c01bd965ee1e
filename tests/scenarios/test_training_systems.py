"""Three training systems of the model scenario on real ranks: judged right, and their defects caught.

- two forwards before one backward under DDP (``fwd`` steps, pytorch#175024): a SyncBN that keeps the first
  forward's statistics on the module is a mismatch on that forward's input gradient; an independent one passes;
- a real ``torch.amp.GradScaler`` (the ``autocast-grad-scaler`` use): correct layers pass with every step taken;
  a loss whose scaled gradient leaves float16's range makes the scaler skip, which is named;
- FSDP2 with mixed precision (the ``fsdp2`` option): correct layers pass, with no collective of FSDP2's counted
  as the implementation's (an evaluation step issues none); a layer that returns its float32 parameters' dtype
  hands the next, half, layer float32 and fails; FSDP2 with DDP, or with validation on one rank, is refused.
"""

from __future__ import annotations

import dataclasses

import pytest

from harness import catalog
from harness.engine.session import RunOptions, resolve_impls, run_selection
from harness.judge.status import Status
from harness.scenarios import sharded

pytestmark = pytest.mark.usefixtures("support_on_path")

TWO_FORWARDS = "ddp/cnn-sgd/broadcast-buffers-True-default-two-forwards/float32/ws2"
SCALED = "autocast/grad-scaler/cnn/ddp/loss-2-10/uneven-8-6/ws2"
FSDP = "fsdp/cnn-sgd/bfloat16/uneven-3-5/ws2"


def run(impls, cases, timeout=120):
    return list(run_selection(cases, resolve_impls(impls), RunOptions(timeout=timeout, diagnose=False)))


@pytest.mark.slow(11)
def test_two_forwards_under_ddp_are_judged_as_one_backward_of_their_sum():
    good, saved = run(["textbook:TextbookSyncBN", "defects:SavesStatsOnModule"], catalog.select([TWO_FORWARDS]))
    assert good.status is Status.PASS, good.message
    # Both forwards' input gradients are judged, each with its own step; the second's after the backward.
    assert {"step0.train.grad_input", "step1.train.grad_input"} <= {k.split(".", 1)[1] for k in good.metrics}
    assert saved.status is Status.MISMATCH
    assert any(name.endswith("step0.train.grad_input") and not m.ok for name, m in saved.metrics.items()), \
        saved.message


@pytest.mark.slow(20)
def test_a_grad_scaler_takes_every_step_with_a_correct_layer_and_a_skipped_step_is_named():
    [case] = catalog.select([SCALED])
    good = run(["textbook:TextbookSyncBN"], [case])[0]
    assert good.status is Status.PASS, good.message
    assert not any(k.endswith("optimizer_step") for k in good.metrics)
    # The loss's gradient 2**16 times larger: scaled by 2**16 it leaves float16's range in the classifier itself,
    # so the scaler skips the step, as it would with nn.BatchNorm: the oracle's gradients stay finite.
    over = dataclasses.replace(case, id=case.id.replace("loss-2-10", "loss-2-0"), grad_scale=1.0, default=False,
                               seed=case.seed)
    [skipped] = run(["textbook:TextbookSyncBN"], [over])
    assert skipped.status is Status.MISMATCH
    named = [m.problem for k, m in skipped.metrics.items() if k.endswith("step0.train.optimizer_step")]
    assert named and all("GradScaler found inf or NaN gradients and skipped the optimizer step (scale 65536 -> "
                         "32768)" in p for p in named), named


@pytest.mark.slow(22)
def test_fsdp2_trains_correct_layers_without_counting_its_own_collectives_and_catches_a_dtype_slip():
    [case] = catalog.select([FSDP])
    good, slip = run(["gather:GatherSyncBN", "defects:OutputInParamDtype"], [case])
    assert good.status is Status.PASS, good.message
    eval_step = len(case.steps) - 1
    for rank in good.ranks:
        calls = rank.collectives or []
        assert calls and not [c for c in calls if c["step"] == eval_step], calls  # FSDP2's all-gathers: unrecorded
        assert {c["op"] for c in calls} <= {"all_gather", "all_reduce"}, {c["op"] for c in calls}
    assert slip.status is Status.ERROR and "Input type (torch.FloatTensor)" in slip.message, slip.message


def test_fsdp2_is_refused_beside_ddp_and_with_validation_on_some_ranks():
    [case] = catalog.select([FSDP])
    with_ddp = dataclasses.replace(case, ddp=("ddp",))
    alone = dataclasses.replace(case, steps=("train", "eval-rank0"))
    assert "both wrap the network" in sharded.fsdp2_unsupported(with_ddp)
    assert "no rank can evaluate while the others wait" in sharded.fsdp2_unsupported(alone)
    assert sharded.fsdp2_unsupported(case) is None
