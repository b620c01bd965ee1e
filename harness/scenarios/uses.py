"""What users do around a network holding SyncBN, for the model scenario (``Case.use``).

Each use changes how a rank runs a step, never what the float64 oracle
expects: checkpointing, scripting and autocast must change nothing but
rounding, and a gradient penalty is judged by the oracle's own second
derivative.

- ``checkpoint-layer`` / ``checkpoint-block`` (``-reentrant`` for
  ``use_reentrant=True``): ``torch.utils.checkpoint`` around every SyncBN
  layer, or around the whole network. The forward runs again in backward; the
  running statistics must still move once per step and the gradients must be
  the uncheckpointed ones (pytorch#96136, #43946).
- ``double-backward``: a gradient penalty. Each rank takes ``g = d(sum(y *
  dy)) / dx`` with ``create_graph=True`` and backpropagates ``sum(y * dy) +
  PENALTY * sum(g ** 2)``; the oracle does the same over the global batch
  (pytorch#61222).
- ``autocast``: the forward under ``torch.autocast`` (bfloat16 on CPU,
  float16 on CUDA) with float32 input and parameters; results are judged with
  the autocast dtype's rounding, and the output's dtype must be the one the
  same network with ``nn.BatchNorm2d`` gives under the same autocast.
- ``script``: every SyncBN layer through ``torch.jit.script`` before
  training, the rest of the network as it is (pytorch#69972; TorchScript is
  deprecated, so an implementation may declare it unsupported).
- ``join``: DDP's ``join()`` with uneven numbers of batches: rank ``r`` has
  ``len(steps) - r`` batches. DDP documents that join does not support
  collectives in the forward pass such as SyncBatchNorm's (pytorch#38174): a
  rank that has joined shadows DDP's all-reduce, not SyncBN's all_gather, so
  the harness expects the failure to be attributed to that collective. A
  SyncBN that supported join would be judged like any DDP step over the ranks
  still holding batches, gradients averaged over the initial world size.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch

from harness.catalog.case import USES  # noqa: F401 - the names, kept with the case's fields
PENALTY = 0.5  # weight of the gradient penalty
# Autocast rounds every layer's output to its dtype in the forward and every gradient in the backward, and the
# weight gradients reduce products of two rounded operands, whose errors an element that cancels keeps whole:
# the model budget with the autocast dtype's roundoff, normwise (every element gets the budget of the tensor's
# largest), times 8. Correct layers (the reference, three independent ones, torch's) used at most 0.14 of it
# over the autocast family's full product and 0.26 over 240 generated autocast cases; the most seen, 0.43, was
# a residual block's input gradient. It is coarse, tens of percent of the tensor's largest value after a few
# steps: it catches a lost momentum rule, NaN, the statistics of the wrong batch, and the output dtype
# exactly, not a reduction rounded to bfloat16.
AUTOCAST_SLACK = 8.0


def checkpointing(case) -> Optional[tuple[str, bool]]:
    """``(where, reentrant)`` for a checkpointing use ("layer" or "block"), else None."""
    if not (case.use or "").startswith("checkpoint-"):
        return None
    parts = case.use.split("-")
    return parts[1], parts[-1] == "reentrant"


def autocast_dtype(case, device: str) -> Optional[torch.dtype]:
    """The dtype autocast gives on ``device`` for an ``autocast`` case, else None."""
    if case.use != "autocast":
        return None
    return torch.float16 if device == "cuda" else torch.bfloat16


def forward_context(case, device: str):
    """The context a rank's forward runs in (autocast, or nothing)."""
    dtype = autocast_dtype(case, device)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device, dtype=dtype)


def layer_call(case):
    """How the network calls each SyncBN layer: through ``checkpoint`` for ``checkpoint-layer``, else None."""
    where = checkpointing(case)
    if where is None or where[0] != "layer":
        return None
    from torch.utils.checkpoint import checkpoint

    return lambda module, x: checkpoint(module, x, use_reentrant=where[1])


def wrap_call(case, call):
    """``call(model, x)`` as the use runs it: the whole forward checkpointed for ``checkpoint-block``."""
    where = checkpointing(case)
    if where is None or where[0] != "block":
        return call
    from torch.utils.checkpoint import checkpoint

    return lambda model, x: checkpoint(call, model, x, use_reentrant=where[1])


def prepare_layer(case, module):
    """A SyncBN layer as the network holds it: scripted for ``script``, else ``module`` itself."""
    if case.use == "script":
        return torch.jit.script(module)
    return module


def backward(case, y: torch.Tensor, x: torch.Tensor, dy: torch.Tensor) -> Optional[torch.Tensor]:
    """Backpropagate one rank's loss; for ``double-backward`` returns the penalized input gradient ``g``."""
    if case.use != "double-backward":
        y.backward(dy)
        return None
    (g,) = torch.autograd.grad(y, x, grad_outputs=dy, create_graph=True)
    ((y * dy).sum() + PENALTY * (g * g).sum()).backward()
    return g


def oracle_backward(case, ys: list, xs: list, gs: list) -> Optional[list]:
    """The oracle's backward of every rank's loss at once (float64); the penalized input gradients, or None."""
    if case.use != "double-backward":
        torch.autograd.backward(ys, gs)
        return None
    loss = sum((y * g).sum() for y, g in zip(ys, gs))
    grads = torch.autograd.grad(loss, xs, create_graph=True)
    (loss + PENALTY * sum((g * g).sum() for g in grads)).backward()
    return [g.detach() for g in grads]


def batches(case, rank: int) -> int:
    """How many of the case's steps rank ``rank`` has a batch for (all but under ``join``)."""
    return len(case.steps) - rank if case.use == "join" else len(case.steps)


def active_ranks(case, step: int) -> int:
    """How many ranks (a prefix 0..n-1) still have a batch at ``step``."""
    return sum(1 for r in range(case.world_size) if step < batches(case, r))


def expected_dtype(case, device: str, layers, build_net) -> Optional[torch.dtype]:
    """The output dtype of the same network with ``nn.BatchNorm2d`` under the case's autocast (None: not one)."""
    dtype = autocast_dtype(case, device)
    if dtype is None:
        return None
    plain = build_net(lambda c: torch.nn.BatchNorm2d(c)).to(device)
    x = torch.ones((2, layers[0][2], 3, 3), device=device)
    with torch.no_grad(), torch.autocast(device_type=device, dtype=dtype):
        return plain(x).dtype
