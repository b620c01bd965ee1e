"""The model scenario's float64 side: the network over the global batch, stepped in lockstep with the ranks.

:class:`Oracle` holds one float64 copy of the network (the ranks' initial
parameters rounded to their dtype), computes every rank's output of a step at
once with batch normalization over the global batch
(:func:`harness.scenarios.networks.oracle_forward`), and, after a training
step, every rank's input gradient and parameter-gradient share of the loss
``sum(y * dy)`` (through the use's :meth:`~harness.scenarios.uses.Use.oracle_backward`).
Forwards whose backward comes later (``fwd`` steps: two forwards, one backward
of the sum, as GAN discriminators train) are kept until the backward, which
then differentiates all of them at once; a rank's share is the sum of its
shares in each. Where the ranks' gradients are averaged (DDP, FSDP2) the
shares' mean accumulates into the parameters' gradients, which the oracle's
own optimizer then steps.

:func:`upstream` draws each rank's gradient of the loss with respect to its
output; :class:`Truth` is the oracle's side of one step.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from harness.catalog.case import Case
from harness.catalog.data import DTYPES
from harness.scenarios import networks

LR = 0.05


def upstream(case: Case, step: int, shapes: list) -> list[torch.Tensor]:
    """Each rank's gradient of the loss with respect to its output at ``step`` (from the case's seed), drawn as
    ``grad_scale * (grad_mean + N(0, 1))``."""
    gen = torch.Generator().manual_seed(case.seed * 31 + 1000 + step)
    out = [torch.randn(shape, generator=gen, dtype=torch.float64) for shape in shapes]
    if case.grad_mean != 0.0 or case.grad_scale != 1.0:
        out = [(g + case.grad_mean) * case.grad_scale for g in out]
    return out


def optimizer_of(case: Case, params):
    """The case's optimizer over ``params`` (SGD with momentum, or Adam), or None."""
    if case.optimizer == "adam":
        return torch.optim.Adam(params, lr=LR / 10)
    if case.optimizer == "sgd":
        return torch.optim.SGD(params, lr=LR, momentum=0.9)
    return None


def frozen_names(case: Case, layers) -> set:
    """The parameters that do not train: every normalization's weight and bias under ``frozen-norm``."""
    if "frozen-norm" not in case.options:
        return set()
    return {f"{layer[1]}.{w}" for layer in layers if layer[0] == "bn" for w in ("weight", "bias")}


@dataclasses.dataclass
class Truth:
    """The oracle's side of one step: every rank's output and upstream gradient, and after its backward every
    rank's input gradient, parameter-gradient shares (on the step that ran the backward) and penalized input
    gradient (None where the use has none)."""

    ys: list
    gs: list
    grad_inputs: Optional[list] = None
    shares: Optional[list] = None
    penalized: Optional[list] = None


class Oracle:
    """The float64 network over the global batch, stepped in lockstep with the ranks."""

    def __init__(self, case: Case, layers, state: dict, use):
        self.case, self.layers, self.use = case, layers, use
        self.names = networks.parameter_names(layers)
        self.frozen = frozen_names(case, layers)
        pdtype = DTYPES[case.param_dtype]
        # Start from what the ranks hold: the parameters rounded to their dtype.
        self.params = {n: state[n].to(pdtype).double().requires_grad_(n not in self.frozen) for n in self.names}
        self.buffers = {n: (v.to(pdtype).double() if v.is_floating_point() else v.clone())
                        for n, v in state.items() if n not in self.names}
        self.opt = optimizer_of(case, [p for p in self.params.values() if p.requires_grad])
        self._forwards: list = []  # (per-rank parameter copies, per-rank inputs) of the forwards awaiting backward

    def forward(self, xs: list[torch.Tensor], train: bool) -> list[torch.Tensor]:
        """Every rank's output (float64, with its graph when training); buffers updated when training."""
        copies = [{n: p.detach().clone().requires_grad_(train and n not in self.frozen)
                   for n, p in self.params.items()} for _ in range(len(xs))]
        inputs = [x.to(torch.float64).requires_grad_(train) for x in xs]
        ys = networks.oracle_forward(self.layers, copies, self.buffers, inputs, train=train, eps=self.case.eps,
                                     momentum=self.case.momentum, param_dtype=DTYPES[self.case.param_dtype])
        if train:
            self._forwards.append((copies, inputs))
        return ys

    def backward(self, truths: list[Truth], averaged: bool, world: int) -> None:
        """The backward of every training forward since the last one (``truths``, oldest first, one per forward):
        fills each one's input gradients and penalized input gradients, and the last one's shares (each rank's
        summed over the forwards). Where ``averaged`` (DDP, FSDP2), the shares' sum over ``world`` accumulates
        into the parameters' gradients, as their all-reduce does."""
        forwards, self._forwards = self._forwards, []
        if len(forwards) != len(truths):
            raise RuntimeError(f"oracle: {len(forwards)} forwards await a backward, {len(truths)} truths given")
        xs = [x for _, inputs in forwards for x in inputs]
        penalized = self.use.oracle_backward([y for t in truths for y in t.ys], xs, [g for t in truths for g in t.gs])
        at = 0
        for t, (_, inputs) in zip(truths, forwards):
            t.grad_inputs = [x.grad for x in inputs]
            t.penalized = penalized[at:at + len(inputs)] if penalized is not None else None
            at += len(inputs)
        ranks = len(forwards[-1][0])
        shares = [{n: _grad_sum(c[r][n].grad for c, _ in forwards if r < len(c)) for n in self.names}
                  for r in range(ranks)]
        truths[-1].shares = shares
        if averaged:
            for n, p in self.params.items():
                if n in self.frozen:
                    continue
                mean = sum(s[n] for s in shares) / world
                p.grad = mean if p.grad is None else p.grad + mean

    def optimizer_step(self) -> None:
        if self.opt is not None:
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        else:
            for p in self.params.values():
                p.grad = None


def _grad_sum(grads):
    """The sum of the gradients given (None where every one is None)."""
    out = None
    for g in grads:
        if g is not None:
            out = g if out is None else out + g
    return out
