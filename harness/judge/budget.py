"""The tolerance policy of a layer's tensors: how far from the float64 oracle a correct SyncBN may be.

It lives here and only here (a whole network's, built from the same
constants, in :mod:`harness.judge.network_budget`); every tolerance leaves
here or :mod:`harness.judge.compare` final (already multiplied by the safety
factor ``K``), and :func:`~harness.judge.elementwise.compare_tensor` applies
it as given.

Notation (per channel, from the oracle): mean mu, 1/std ``invstd``, weight w,
bias b, xhat = (x - mu) * invstd, N the group's element count per channel,
n this rank's. Unit roundoffs: ``u_in`` of the input dtype, ``u_p`` of the
parameter dtype, ``u_a`` of the accumulation (float32, or float64 when input
and parameters are float64: SyncBN implementations accumulate statistics in
at least float32, as the ATen contract does for half input).

A reduction of N terms in floating point has error growing like sqrt(N)
(random rounding) and at worst like N; a correct implementation may use any
order, pairwise, Welford or a two-level merge, so the budget is
``gamma(N) = 2 * sqrt(N) + 2`` unit roundoffs, times a safety factor
``K = 8``. Statistics carry an extra factor ``(1 + invstd * |mu|)``: a stable
algorithm's variance is exact up to rounding of the mean, whose error is
relative to |mu|, not to the spread. Defects are not small: a wrong merge
weight, a biased variance or a dropped rank changes results by percent, which
these budgets leave far behind (the harness's tests check both sides: correct
results accumulated in float64 and in float32 pass, planted defects fail).

Per tensor (elementwise absolute tolerance):
- output:      u_in (|y| + |w| |xhat| + |b|) + u_a gamma(N) |w| (1 + |xhat|) (1 + invstd |mu|)
- grad_input:  with D = |dy| + mean|dy| + |xhat| mean|dy xhat| (means over the group's N values),
               (u_in + u_a gamma(N) (1 + invstd |mu|)) |w| invstd D  + u_in |dx|
- grad_weight: (u_in + u_a (gamma(n) + gamma(N)) (1 + invstd |mu|)) sum|dy xhat|
               + u_a gamma(N) (1 + invstd |mu|) sum|dy| + u_p |gw|
  (the second term is the error of xhat itself, u_a gamma(N) (1 + invstd |mu|)
  per element, which does not vanish where the oracle's xhat does: a constant
  channel's float32 mean is off by a rounding, and invstd is 1/sqrt(eps))
- grad_bias:   (u_in + u_a gamma(n)) sum|dy| + u_p |gb|
- running_mean after t updates: u t (|rm| + |mu|) + u_a gamma(N) f (|mu| + std)
- running_var  after t updates: u t (|rv| + var) + 2 u_a gamma(N) f (var + eps) (1 + invstd |mu|)
  (u = max(u_p, u_a): the update may be computed in the accumulation type, as torch's CUDA
  gather does for float32 input with float64 buffers)
  (f is the momentum factor; variance is recovered from 1/std by subtracting
  eps in torch's algorithm, hence the eps term)
- eval outputs, input gradients and grad_weight add the running statistics' own budget,
  carried through the normalization.
- num_batches_tracked: exact.
Every tolerance is multiplied by K (here, once). NaN or Inf where the oracle is finite is a
mismatch, as is a wrong dtype, shape or output memory format; where the oracle's value lies beyond
the expected dtype's range, infinity (or the largest finite value) of its sign is the right answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from harness.catalog.case import Case
from harness.catalog.data import DTYPES
from harness.catalog.dtypes import ROUNDOFF_OF
from harness.slices import batch_slices

K = 8.0
UNIT_ROUNDOFF = {DTYPES[name]: u for name, u in ROUNDOFF_OF.items()}  # by torch dtype


def gamma(n: int) -> float:
    """Rounding-error growth of a reduction over ``n`` terms, in unit roundoffs."""
    return 2.0 * math.sqrt(max(n, 1)) + 2.0


def per_channel(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A per-channel vector shaped to broadcast over ``like`` (N, C, *spatial)."""
    return v.view(1, -1, *([1] * (like.dim() - 2)))


def _dims(x: torch.Tensor) -> list[int]:
    return [0] + list(range(2, x.dim()))


def abs_xhat(x: torch.Tensor, mu: torch.Tensor, invstd: torch.Tensor) -> torch.Tensor:
    """|x - mu| invstd in float64 (a fresh tensor, whatever ``x``'s dtype)."""
    return x.detach().to(torch.float64, copy=True).sub_(per_channel(mu, x)).mul_(per_channel(invstd, x)).abs_()


@dataclass
class ShareSums:
    """One rank's per-channel sums of magnitudes at one step, which every gradient share's budget uses."""

    abs_dy: torch.Tensor  # sum |dy| over (N, *spatial)
    abs_dy_xhat: torch.Tensor  # sum |dy xhat| (= sum |dy| |xhat|, the same products)


def share_sums(x: torch.Tensor, dy: torch.Tensor, mu: torch.Tensor, invstd: torch.Tensor) -> ShareSums:
    """:class:`ShareSums` of ``x`` and ``dy`` (any float dtype) normalized with ``mu`` and ``invstd``, a batch
    slice at a time in float64."""
    dims = _dims(x)
    abs_dy = torch.zeros(x.shape[1], dtype=torch.float64)
    abs_dy_xhat = torch.zeros(x.shape[1], dtype=torch.float64)
    for a, b in batch_slices(x):
        d = dy[a:b].detach().to(torch.float64, copy=True).abs_()
        abs_dy += d.sum(dim=dims)
        abs_dy_xhat += d.mul_(abs_xhat(x[a:b], mu, invstd)).sum(dim=dims)
    return ShareSums(abs_dy, abs_dy_xhat)


class Budget:
    """The tolerances of one case (see the module docstring); every method returns a final tolerance (x K)."""

    def __init__(self, case: Case):
        self.case = case
        self.dtype = DTYPES[case.dtype]
        self.pdtype = DTYPES[case.param_dtype]
        self.u_in = UNIT_ROUNDOFF[self.dtype]
        self.u_p = UNIT_ROUNDOFF[self.pdtype]
        both64 = self.dtype == torch.float64 and self.pdtype == torch.float64
        self.u_a = UNIT_ROUNDOFF[torch.float64 if both64 else torch.float32]

    @staticmethod
    def stats_factor(mean: torch.Tensor, invstd: torch.Tensor) -> torch.Tensor:
        """``1 + invstd |mu|``: statistics are exact up to rounding relative to the mean, not the spread."""
        return 1.0 + invstd * mean.abs()

    def grad_weight_share(self, x, dy, mu, invstd, g_N: float, sums: Optional[ShareSums] = None) -> torch.Tensor:
        """Unscaled budget of one rank's grad_weight share (without the parameter dtype's rounding);
        ``sums``: :func:`share_sums` of these tensors, when the caller has them."""
        if not x.numel():
            return torch.zeros_like(mu)
        sums = sums or share_sums(x, dy, mu, invstd)
        sf = self.stats_factor(mu, invstd)
        n = x.numel() // x.shape[1]
        return (self.u_in + self.u_a * (gamma(n) + g_N) * sf) * sums.abs_dy_xhat + self.u_a * g_N * sf * sums.abs_dy

    def running(self, truths, rank: int) -> list[tuple]:
        """Per step, the unscaled running-statistics budgets ``(rm_tol, rv_tol)`` before and after it.

        Each update adds the rounding of the update (in the accumulation type when it is wider than the
        buffers': torch's CUDA gather updates float64 buffers of float32 input in float32) and the batch
        statistics' error times the momentum factor; budgets of earlier steps decay by (1 - f) but never
        vanish, so they are kept. ``(None, None)`` before the first update or without running statistics.
        """
        case = self.case
        out = []
        train_steps = 0
        rm_tol = rv_tol = None
        u_upd = max(self.u_p, self.u_a)
        for truth in truths:
            before = (rm_tol, rv_tol)
            if case.track_running_stats:
                train = truth.kind == "train"
                train_steps += train
                mu, invstd, N = truth.mean[rank], truth.invstd[rank], truth.count[rank]
                f = (1.0 / train_steps if case.momentum is None else case.momentum) if train_steps else 0.0
                rm_true, rv_true = truth.running_mean[rank], truth.running_var[rank]
                var = 1.0 / (invstd * invstd) - case.eps if train else rv_true
                step_rm = u_upd * max(train_steps, 1) * (rm_true.abs() + (mu.abs() if train else 0))
                step_rv = u_upd * max(train_steps, 1) * (rv_true.abs() + (var.abs() if train else 0))
                if train:
                    g_N = gamma(N)
                    step_rm = step_rm + self.u_a * g_N * f * (mu.abs() + var.clamp_min(0).sqrt())
                    step_rv = step_rv + 2 * self.u_a * g_N * f * (var.abs() + case.eps) * self.stats_factor(mu,
                                                                                                            invstd)
                rm_tol = step_rm if rm_tol is None else torch.maximum(rm_tol, step_rm)
                rv_tol = step_rv if rv_tol is None else torch.maximum(rv_tol, step_rv)
            out.append((before, (rm_tol, rv_tol)))
        return out

    @staticmethod
    def eval_grad_weight(x, dy, mu, invstd, before: tuple, sums: Optional[ShareSums] = None) -> torch.Tensor:
        """What an eval step's grad_weight share adds for the running statistics it normalized with
        (d gw / d rm = -invstd sum dy; d gw / d rv = -invstd^2 sum dy xhat / 2)."""
        rm_tol, rv_tol = before
        if rm_tol is None or not x.numel():
            return torch.zeros_like(mu)
        sums = sums or share_sums(x, dy, mu, invstd)
        return rm_tol * invstd * sums.abs_dy + 0.5 * rv_tol * invstd ** 2 * sums.abs_dy_xhat

    def grad_bias_share(self, x, dy, sums: Optional[ShareSums] = None) -> torch.Tensor:
        """Unscaled budget of one rank's grad_bias share (without the parameter dtype's rounding)."""
        if not x.numel():
            return torch.zeros(x.shape[1], dtype=torch.float64)
        n = x.numel() // x.shape[1]
        return (self.u_in + self.u_a * gamma(n)) * (sums.abs_dy if sums else dy.abs().sum(dim=_dims(x)))


def sum_tolerance(case: Case, data, truths, step: int, which: str) -> torch.Tensor:
    """Final tolerance of the sum over ranks of grad_weight or grad_bias at ``step`` (per channel)."""
    b = Budget(case)
    total = torch.zeros(case.channels, dtype=torch.float64)
    truth = truths[step]
    g_N = None
    for r in range(case.world_size):
        x = data.inputs[step][r].double()
        dy = data.grad_outputs[step][r].double()
        g_N = gamma(truth.count[r]) if truth.kind == "train" or not case.track_running_stats else 1.0
        if which == "grad_weight":
            total += b.grad_weight_share(x, dy, truth.mean[r], truth.invstd[r], g_N)
            if truth.kind != "train" and case.track_running_stats:
                total += b.eval_grad_weight(x, dy, truth.mean[r], truth.invstd[r], b.running(truths, r)[step][0])
        else:
            total += b.grad_bias_share(x, dy)
    true_sum = truth.grad_weight_sum if which == "grad_weight" else truth.grad_bias_sum
    return K * (total + b.u_p * case.world_size * true_sum.abs())


def sum_tolerance_of(case: Case, budgets: list[dict], abs_true: list[float], step: str, which: str) -> torch.Tensor:
    """:func:`sum_tolerance` from the ranks' own budgets (``budgets``: each rank's from
    :func:`~harness.judge.compare.judge_rank`, in rank order) and ``|true sum|``: the same terms added in the same
    order, without any rank's tensors."""
    b = Budget(case)
    total = torch.zeros(case.channels, dtype=torch.float64)
    for rank_budgets in budgets:
        terms = rank_budgets[step]
        if which == "grad_weight":
            total += torch.tensor(terms["grad_weight"], dtype=torch.float64)
            if terms["grad_weight_eval"] is not None:
                total += torch.tensor(terms["grad_weight_eval"], dtype=torch.float64)
        else:
            total += torch.tensor(terms["grad_bias"], dtype=torch.float64)
    return K * (total + b.u_p * case.world_size * torch.tensor(abs_true, dtype=torch.float64))
