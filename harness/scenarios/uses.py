"""What users do around a network holding SyncBN, for the model scenario (``Case.use``): one class per use.

Each use changes how a rank runs a step, never what the float64 oracle
expects: checkpointing, scripting and autocast must change nothing but
rounding, and a gradient penalty is judged by the oracle's own second
derivative. :class:`Use` is the plain network (every hook does what a
training loop without the use does); each use overrides the hooks it
changes, and :data:`BY_NAME` maps the catalog's names
(:data:`harness.catalog.case.USES`, the one place they are spelled) to the
instances. The model scenario asks for its case's use once (:func:`of`).

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
- ``autocast-grad-scaler``: float16 autocast on every device (CPU included:
  a loss scaler exists for float16's range) and a real
  ``torch.amp.GradScaler`` around the backward and the optimizer step, as AMP
  training runs it: the loss (float32) is scaled by 2**16, the gradients
  unscaled before they are judged, the step taken by the scaler. A correct
  layer's gradients stay finite, so the scaler must skip no step (a skipped
  step is a failure, named); the rank's input gradient is judged unscaled.
  Gradients scaled so reach SyncBN's backward: half partial sums past 65,504
  are inf there (pytorch#195701). Needs an optimizer.
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
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from harness.catalog.case import Case

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


class Use:
    """The plain network: a training loop with no use around it. Subclasses override the hooks they change."""

    def prepare_layer(self, module: torch.nn.Module) -> torch.nn.Module:
        """A SyncBN layer as the network holds it."""
        return module

    def layer_call(self) -> Optional[Callable]:
        """How the network calls each SyncBN layer, ``(module, x) -> y``; None: directly."""
        return None

    def wrap_call(self, call: Callable) -> Callable:
        """``call(model, x)`` as the use runs it."""
        return call

    def autocast_dtype(self, device: str) -> Optional[torch.dtype]:
        """The dtype the forward is autocast to on ``device``; None: no autocast."""
        return None

    def forward_context(self, device: str):
        """The context a rank's forward runs in (autocast, or nothing)."""
        dtype = self.autocast_dtype(device)
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device, dtype=dtype)

    def expected_dtype(self, device: str, layers, build_net) -> Optional[torch.dtype]:
        """The output dtype of the same network with ``nn.BatchNorm2d`` under the use's autocast (None: none)."""
        return None

    def backward(self, ys: list, xs: list, dys: list) -> Optional[list]:
        """Backpropagate one rank's loss ``sum(y * dy)`` over its forwards since the last backward (one output,
        input and upstream gradient each, oldest first: two with a ``fwd`` step); the penalized input gradients
        to judge (one per forward), or None."""
        torch.autograd.backward(ys, dys)
        return None

    def input_grad_scale(self) -> float:
        """What the rank's input gradients are multiplied by (a loss scaler's scale), to be judged divided."""
        return 1.0

    def unscale(self, opt) -> None:
        """Before the parameters' gradients are judged (and the optimizer steps): nothing, or unscale them."""

    def step(self, opt) -> list[str]:
        """The optimizer step; what went wrong with it (a step a loss scaler skipped), one sentence each."""
        opt.step()
        return []

    def needs_optimizer(self) -> bool:
        """Whether the use needs the case to have an optimizer."""
        return False

    def oracle_backward(self, ys: list, xs: list, gs: list) -> Optional[list]:
        """The oracle's backward of every rank's loss at once (float64); the penalized input gradients, or None."""
        torch.autograd.backward(ys, gs)
        return None

    def batches(self, case: Case, rank: int) -> int:
        """How many of the case's steps rank ``rank`` has a batch for."""
        return len(case.steps)

    def active_ranks(self, case: Case, step: int) -> int:
        """How many ranks (a prefix 0..n-1) still have a batch at ``step``."""
        return sum(1 for r in range(case.world_size) if step < self.batches(case, r))

    def around_steps(self, model):
        """The context every step of a rank runs in (``model``: the network, or its DDP wrapper)."""
        return contextlib.nullcontext()


@dataclass(frozen=True)
class Checkpoint(Use):
    """``torch.utils.checkpoint`` around every SyncBN layer (``where="layer"``) or the whole network
    (``"block"``), with ``use_reentrant=reentrant``."""

    where: str
    reentrant: bool

    def layer_call(self) -> Optional[Callable]:
        if self.where != "layer":
            return None
        from torch.utils.checkpoint import checkpoint

        return lambda module, x: checkpoint(module, x, use_reentrant=self.reentrant)

    def wrap_call(self, call: Callable) -> Callable:
        if self.where != "block":
            return call
        from torch.utils.checkpoint import checkpoint

        return lambda model, x: checkpoint(call, model, x, use_reentrant=self.reentrant)


class GradientPenalty(Use):
    """``double-backward``: the loss plus ``PENALTY * sum(g ** 2)``, ``g`` the input gradient (create_graph)."""

    def backward(self, ys: list, xs: list, dys: list) -> Optional[list]:
        grads = torch.autograd.grad(ys, xs, grad_outputs=dys, create_graph=True)
        (sum((y * dy).sum() for y, dy in zip(ys, dys)) + PENALTY * sum((g * g).sum() for g in grads)).backward()
        return list(grads)

    def oracle_backward(self, ys: list, xs: list, gs: list) -> Optional[list]:
        loss = sum((y * g).sum() for y, g in zip(ys, gs))
        grads = torch.autograd.grad(loss, xs, create_graph=True)
        (loss + PENALTY * sum((g * g).sum() for g in grads)).backward()
        return [g.detach() for g in grads]


class Autocast(Use):
    """``autocast``: the forward under ``torch.autocast`` (bfloat16 on CPU, float16 on CUDA)."""

    def autocast_dtype(self, device: str) -> Optional[torch.dtype]:
        return torch.float16 if device == "cuda" else torch.bfloat16

    def expected_dtype(self, device: str, layers, build_net) -> Optional[torch.dtype]:
        plain = build_net(lambda c: torch.nn.BatchNorm2d(c)).to(device)
        x = torch.ones((2, layers[0][2], 3, 3), device=device)
        with torch.no_grad(), torch.autocast(device_type=device, dtype=self.autocast_dtype(device)):
            return plain(x).dtype


class ScaledAutocast(Autocast):
    """``autocast-grad-scaler``: float16 autocast and a ``torch.amp.GradScaler`` (one per case, made by
    :meth:`around_steps`) around the backward and the optimizer step."""

    def __init__(self):
        self.scaler = None

    def autocast_dtype(self, device: str) -> Optional[torch.dtype]:
        return torch.float16

    def needs_optimizer(self) -> bool:
        return True

    @contextlib.contextmanager
    def around_steps(self, model):
        device = next(model.parameters()).device.type
        self.scaler = torch.amp.GradScaler(device)  # its defaults: a scale of 2**16, halved on inf or NaN
        try:
            yield
        finally:
            self.scaler = None

    def backward(self, ys: list, xs: list, dys: list) -> Optional[list]:
        loss = sum((y.float() * dy.float()).sum() for y, dy in zip(ys, dys))  # the loss in float32, as AMP's
        self.scaler.scale(loss).backward()
        return None

    def input_grad_scale(self) -> float:
        return float(self.scaler.get_scale())

    def unscale(self, opt) -> None:
        self.scaler.unscale_(opt)

    def step(self, opt) -> list[str]:
        before = self.scaler.get_scale()
        self.scaler.step(opt)
        self.scaler.update()
        after = self.scaler.get_scale()
        if after < before:
            return [f"GradScaler found inf or NaN gradients and skipped the optimizer step (scale {before:g} -> "
                    f"{after:g}); the oracle's are finite"]
        return []


class Script(Use):
    """``script``: every SyncBN layer through ``torch.jit.script`` before training."""

    def prepare_layer(self, module: torch.nn.Module) -> torch.nn.Module:
        return torch.jit.script(module)


class Join(Use):
    """``join``: DDP's ``join()`` around the steps, rank ``r`` holding ``len(steps) - r`` batches."""

    def batches(self, case: Case, rank: int) -> int:
        return len(case.steps) - rank

    def around_steps(self, model):
        return model.join()


PLAIN = Use()
BY_NAME: dict[str, Use] = {
    "checkpoint-layer": Checkpoint("layer", reentrant=False),
    "checkpoint-layer-reentrant": Checkpoint("layer", reentrant=True),
    "checkpoint-block": Checkpoint("block", reentrant=False),
    "checkpoint-block-reentrant": Checkpoint("block", reentrant=True),
    "double-backward": GradientPenalty(),
    "autocast": Autocast(),
    "autocast-grad-scaler": ScaledAutocast(),
    "script": Script(),
    "join": Join(),
}


def of(case: Case) -> Use:
    """The case's use (:data:`PLAIN` when it has none)."""
    return PLAIN if case.use is None else BY_NAME[case.use]
