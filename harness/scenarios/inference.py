"""The inference scenario: a converted model trained on the ranks, then evaluated, traced and exported on CPU as
shipped, each judged by the unconverted model in float64.

What users do after training with SyncBN: evaluate the trained model on CPU, ``torch.jit.trace`` it or
``torch.export.export`` it, in the training process (pytorch#82464: a trace on CPU that raised "SyncBatchNorm
expected input tensor to be on GPU") or in an inference process of its own (yolov5#1018, mmseg#387: CPU
inference and export of a model holding SyncBN). In a pool without a process group (``Case.backend`` ``no-group``)
the training itself runs with none, as a user's single process does (pytorch#63662).

Per rank: build the case's model (:mod:`harness.scenarios.user_models`), convert it with the implementation's
converter over the case's process group (None without one), and run the case's training steps exactly as the
conversion scenario does (:func:`harness.scenarios.conversion.run_step`: output, input gradient, gradient shares
and buffers against the unconverted model in float64 on the global batch). Every ``eval`` step (they come after
the training steps) is inference, on rank 0 alone (as a trained model is evaluated or exported once; the other
ranks are done): the trained model itself, moved to CPU and put in eval mode, its layers as the implementation
ships them (:meth:`harness.impls.base.Impl.shipped`: in cpu-emulation torch's own ``forward``, its device check
unanswered), runs rank 0's batch of the step three ways (:data:`PROGRAMS`): eagerly,
through ``torch.jit.trace`` and through ``torch.export.export`` (its ``module()``), each program made from that
batch under ``torch.no_grad()``. Each program is called on that batch and on a second one of the same shape
(:func:`second_batch`): a program that baked in a value of the first batch shows on the second. Every output is
judged against the float64 unconverted model in eval mode on the same batch (the oracle after the same training
steps: the same running statistics), and afterwards every BatchNorm buffer must be what the oracle's is
(inference moves nothing). A traced program that calls ``aten::batch_norm`` must also record there the momenta
the unconverted model's own trace records (what an ONNX export writes, pytorch#18525). No collective may be issued
there. An exception raised by the model or by making a
program is the implementation's (an ``error``; its traceback says which program).

Across ranks (in the parent): every buffer bitwise the same on every rank after each step
(:func:`harness.scenarios.model.judge_across`).
"""

from __future__ import annotations

from functools import partial
from typing import Optional

import torch

from harness.catalog.case import STEP_KINDS, Case
from harness.catalog.data import DTYPES, materialize
from harness.judge.compare import compare_tensor
from harness.judge.metric import Metric
from harness.judge.metric_key import step_key
from harness.judge.network_budget import network_tolerance
from harness.scenarios import user_models
from harness.scenarios.across import Across
from harness.scenarios.conversion import run_step
from harness.scenarios.model import judge_across, judge_buffers

__all__ = ["run_rank", "judge_across", "unsupported_reason", "PROGRAMS", "second_batch", "infer"]

SECOND = ".second_batch"  # the suffix of an output's name on the second batch


def _eager(model, x):
    return model


def _traced(model, x):
    return torch.jit.trace(model, (x,))


def _exported(model, x):
    return torch.export.export(model, (x,)).module()


# Each program's name (the prefix of its outputs' names; the eager one has none) and how it is made from the model
# and the batch it is made from.
PROGRAMS = (("", _eager), ("trace.", _traced), ("export.", _exported))


def unsupported_reason(case: Case, impl, device: str, backend: str) -> Optional[str]:
    """Inference steps come last (the model is on CPU after them); ``torch.export`` is torch >= 2.1's."""
    kinds = [STEP_KINDS[k] for k in case.steps]
    if "eval" in kinds and "train" in kinds[kinds.index("eval"):]:
        return f"inference steps come after every training step, got {list(case.steps)}"
    if not hasattr(torch, "export"):
        return f"torch {torch.__version__} has no torch.export (torch >= 2.1)"
    return None


def second_batch(x: torch.Tensor) -> torch.Tensor:
    """Another batch of ``x``'s shape and dtype: its samples in reverse order, times 2 plus 1."""
    return x.flip(0) * 2 + 1


def infer(case: Case, impl, model: torch.nn.Module, oracle: torch.nn.Module, x: torch.Tensor, step: int,
          metrics: list) -> dict:
    """One inference step of the trained ``model`` (already on CPU) on this rank's batch ``x``, beside the float64
    ``oracle``: every program of :data:`PROGRAMS` judged on ``x`` and on :func:`second_batch`, then the buffers.
    Returns the buffers' bits, by name."""
    key = partial(step_key, step, "eval")
    batches = {"": x, SECOND: second_batch(x)}
    model.eval()
    oracle.eval()
    with torch.no_grad():
        truths = {suffix: oracle(b.to(torch.float64)) for suffix, b in batches.items()}
    reduction = max(1, x.numel() // max(1, x.shape[1]))
    depth = 2 * len(user_models.batch_norms(oracle)) + 1

    def judge(name, got, true, dtype=None):
        tol = network_tolerance(true, case, reduction, depth, step)
        metrics.append((key(name), compare_tensor(None if got is None else got.detach().cpu(), true, tol,
                                                  dtype=dtype)))

    with impl.shipped(model), torch.no_grad():
        for name, make in PROGRAMS:
            program = make(model, x)
            if make is _traced:
                _judge_recorded_momenta(program, oracle, metrics, key)
            for suffix, b in batches.items():
                y = impl.forward(program, b) if program is model else program(b)
                judge(f"{name}output{suffix}", y, truths[suffix], DTYPES[case.dtype])
    # Every name a shared buffer is reachable by (torch >= 2.0, as torch.export needs 2.1).
    truth = dict(oracle.named_buffers(remove_duplicate=False))
    return judge_buffers(model.named_buffers(remove_duplicate=False), truth, judge, metrics, key,
                         DTYPES[case.param_dtype])


def recorded_momenta(traced) -> list:
    """The momentum each ``aten::batch_norm`` call of a traced program records, in graph order: what the
    TorchScript-based ONNX exporter writes into each BatchNormalization node (as 1 - momentum)."""
    return [list(node.inputs())[6].toIValue() for node in traced.inlined_graph.nodes()
            if node.kind() == "aten::batch_norm"]


def _judge_recorded_momenta(traced, oracle: torch.nn.Module, metrics: list, key) -> None:
    """The traced program's momenta against the unconverted model's layers' (pytorch#18525: SyncBN's eval
    recorded momentum 0 whatever the layer's, so ONNX exports wrote 1.0)."""
    # nn.BatchNorm's eval passes its momentum (0.0 for None): from the layers' settings, not from a trace of the
    # oracle (a torch whose batchnorm.py is patched, as `undo` patches it, would trace the oracle the same way).
    want = [0.0 if bn.momentum is None else bn.momentum for bn in user_models.batch_norms(oracle).values()]
    got = recorded_momenta(traced)
    if got and got != want:  # none: its own ops normalize (the reference's), nothing recorded to compare
        metrics.append((key("trace.momentum"), Metric.failure(
            f"the traced program records momentum {got} in its batch_norm calls, the unconverted model {want} "
            "(what an ONNX export writes)")))


def run_rank(ctx, case: Case, impl, device: str, result, compare_with: Optional[str] = None) -> None:
    """Convert the case's model with ``impl``, train it as the conversion scenario does, then infer on CPU."""
    pdtype = DTYPES[case.param_dtype]
    model = user_models.build(case.model, case.channels, case.seed, dtype=pdtype, param_dtype=pdtype)
    oracle = user_models.build(case.model, case.channels, case.seed, dtype=torch.float64, param_dtype=pdtype)
    model.train()
    oracle.train()
    model = impl.convert(model, ctx.process_group(case)).to(device)
    data = materialize(case)
    metrics: list = []
    bitwise: dict[int, dict] = {}
    try:
        for s, kind in enumerate(case.steps):
            ctx.mark_step(s)
            if STEP_KINDS[kind] == "train":
                bitwise[s] = run_step(case, impl, device, ctx.rank, model, oracle, data.inputs[s],
                                      data.grad_outputs[s], s, metrics)
                continue
            if ctx.rank != 0:  # rank 0 alone infers, as a trained model is exported once; the others are done
                continue
            model = model.cpu()
            with ctx.forbid_collectives("inference on CPU"):
                bitwise[s] = infer(case, impl, model, oracle, data.inputs[s][0].detach().clone(), s, metrics)
        ctx.mark_step(None)
    finally:  # what was judged before an exception stays in the record beside it (a traced program's mismatch)
        result.across = Across(bitwise=bitwise)
        result.metrics = dict(metrics)
