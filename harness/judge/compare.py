"""Judgement: one implementation's tensors against the float64 oracle.

The tolerance policy of a layer's tensors lives here and only here (a whole
network's, built from the same constants, in :mod:`harness.judge.network_budget`); every tolerance leaves this
module final (already multiplied by the safety factor ``K``), and
:func:`compare_tensor` applies it as given.

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
from functools import partial
from typing import Optional

import torch

from harness.catalog.case import Case
from harness.catalog.data import DTYPES, MEMORY_FORMATS
from harness.catalog.dtypes import ROUNDOFF_OF
from harness.judge.elementwise import compare_tensor
from harness.judge.metric import Metric
from harness.judge.metric_key import step_key, sum_key
from harness.slices import batch_slices

K = 8.0
UNIT_ROUNDOFF = {DTYPES[name]: u for name, u in ROUNDOFF_OF.items()}  # by torch dtype


def gamma(n: int) -> float:
    """Rounding-error growth of a reduction over ``n`` terms, in unit roundoffs."""
    return 2.0 * math.sqrt(max(n, 1)) + 2.0


def _chan(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return v.view(1, -1, *([1] * (like.dim() - 2)))


def _dims(x: torch.Tensor) -> list[int]:
    return [0] + list(range(2, x.dim()))


def _abs_xhat(x: torch.Tensor, mu: torch.Tensor, invstd: torch.Tensor) -> torch.Tensor:
    """|x - mu| invstd in float64 (a fresh tensor, whatever ``x``'s dtype)."""
    return x.detach().to(torch.float64, copy=True).sub_(_chan(mu, x)).mul_(_chan(invstd, x)).abs_()


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
        abs_dy_xhat += d.mul_(_abs_xhat(x[a:b], mu, invstd)).sum(dim=dims)
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


def judge_rank(case: Case, rank: int, data, truths, observed: list[dict],
               budgets: Optional[dict] = None) -> list[tuple[str, Metric]]:
    """Compare rank ``rank``'s observed tensors of every step with the oracle.

    ``observed[s]`` holds ``output``, ``grad_input``, ``grad_weight``,
    ``grad_bias``, ``running_mean``, ``running_var``, ``num_batches_tracked``
    (tensors or None) after step ``s``, or is None where the rank took no part
    in the step. ``grads`` says whose gradients it holds: ``own`` (its
    backward), ``none`` (no backward), ``deferred`` (the parameters' come with
    a later step), ``accumulated`` (the parameters' are the sum over
    ``grad_steps``). ``layout_checked`` False: the input was a view dense in no
    memory format, so no output layout is required. ``budgets``, when given, receives
    this rank's unscaled budgets of its grad_weight and grad_bias shares per step
    (``{step: {"grad_weight", "grad_weight_eval", "grad_bias"}}``, lists), the
    terms :func:`sum_tolerance_of` adds up over the ranks.
    """
    step = _StepJudge(case, Budget(case), data, rank)
    out: list[tuple[str, Metric]] = []
    running = step.budget.running(truths, rank)  # unscaled running-statistics budgets before and after each step
    shares: list = []  # per step: this rank's true grad_weight/grad_bias shares and their unscaled budgets
    for s, (truth, obs) in enumerate(zip(truths, observed)):
        step.at(s, truth, running[s])
        if case.affine:
            shares.append(step.shares(budgets))
        if obs is None:
            continue  # this rank takes no part in the step (evaluation on rank 0 alone)
        key = partial(step_key, s, truth.kind)
        out.append((key("output"), step.output(obs)))
        grads = obs.get("grads", "own")  # own | none (no backward) | deferred (a later step's) | accumulated
        if grads != "none":
            out.append((key("grad_input"), step.grad_input(obs)))
        if case.affine and grads in ("own", "accumulated"):
            out += [(key(name), metric) for name, metric in step.parameters(obs, shares)]
        if case.track_running_stats:
            out += [(key(name), metric) for name, metric in step.buffers(obs)]
    return out


class _StepJudge:
    """One rank's judgement of one step at a time (:meth:`at`), a tensor per method.

    Each tolerance is a per-channel combination of elementwise magnitudes with K and the unit roundoffs folded
    into per-channel coefficients, built in place a batch slice at a time as the comparison asks for it (a large
    case's judgement is mostly elementwise passes over float64 tensors).
    """

    def __init__(self, case: Case, budget: Budget, data, rank: int):
        self.case, self.budget, self.data, self.rank = case, budget, data, rank
        self.format = MEMORY_FORMATS[case.memory_format]
        self.w = data.weight.double() if case.affine else torch.ones(case.channels, dtype=torch.float64)
        self.bias = data.bias.double() if case.affine else torch.zeros(case.channels, dtype=torch.float64)

    def at(self, s: int, truth, running: tuple) -> None:
        """Move to step ``s``: its truth and the running statistics' unscaled budgets (before, after) it."""
        case, rank, b = self.case, self.rank, self.budget
        self.s, self.truth, self.running = s, truth, running
        # Widened to float64 a batch slice at a time where they are used.
        self.x, self.dy = self.data.inputs[s][rank], self.data.grad_outputs[s][rank]
        self.mu, self.invstd, N = truth.mean[rank], truth.invstd[rank], truth.count[rank]
        self.train = truth.kind == "train"
        self.sf = b.stats_factor(self.mu, self.invstd)
        # Batch statistics (a reduction over N) normalize in training, and in eval without running statistics.
        self.g_N = gamma(N) if self.train or not case.track_running_stats else 1.0
        self._sums = ShareSums(truth.rank_abs_dy[rank], truth.rank_abs_dy_xhat[rank]) \
            if truth.rank_abs_dy and truth.rank_abs_dy[rank] is not None else None  # the oracle summed them already

    @property
    def sums(self) -> ShareSums:
        """This rank's sums of |dy| and |dy xhat| at this step (from the oracle, else summed once when asked)."""
        if self._sums is None:
            self._sums = share_sums(self.x, self.dy, self.mu, self.invstd)
        return self._sums

    def shares(self, budgets: Optional[dict]) -> tuple:
        """This rank's true grad_weight and grad_bias shares at this step and their unscaled budgets (written to
        ``budgets`` too, when given)."""
        b, x, dy, mu, invstd = self.budget, self.x, self.dy, self.mu, self.invstd
        gw_share = b.grad_weight_share(x, dy, mu, invstd, self.g_N, self.sums)
        # Eval normalizes with the implementation's running statistics: carry their budget.
        gw_eval = b.eval_grad_weight(x, dy, mu, invstd, self.running[0], self.sums) \
            if not self.train and self.case.track_running_stats else None
        gb_share = b.grad_bias_share(x, dy, self.sums)
        if budgets is not None:
            budgets[str(self.s)] = {"grad_weight": gw_share.tolist(), "grad_bias": gb_share.tolist(),
                                    "grad_weight_eval": None if gw_eval is None else gw_eval.tolist()}
        return (self.truth.grad_weight[self.rank], self.truth.grad_bias[self.rank],
                gw_share if gw_eval is None else gw_share + gw_eval, gb_share)

    def output(self, obs: dict) -> Metric:
        """Output: u_in (|y| + |w| |xhat| + |b|) + u_a g_N |w| sf (1 + |xhat|)."""
        b, x = self.budget, self.x
        y = self.truth.output[self.rank]
        w_abs = self.w.abs()
        c_round = b.u_a * self.g_N * w_abs * self.sf
        coef_xhat = b.u_in * w_abs + c_round
        coef_one = b.u_in * self.bias.abs() + c_round
        rm_tol, rv_tol = self.running[0]
        if not self.train and rm_tol is not None:
            # Eval normalizes with the implementation's running statistics: carry their budget, x (1 + |xhat|).
            c_running = w_abs * self.invstd * (rm_tol + 0.5 * rv_tol * self.invstd)
            coef_xhat, coef_one = coef_xhat + c_running, coef_one + c_running
        tol = partial(_output_tolerance, y=y, x=x, mu=self.mu, invstd=self.invstd, c_y=K * b.u_in,
                      c_xhat=_chan(K * coef_xhat, x), c_one=_chan(K * coef_one, x))
        expected_format = self.format if obs.get("layout_checked", True) else None
        return compare_tensor(obs["output"], y, tol, dtype=b.dtype, memory_format=expected_format)

    def grad_input(self, obs: dict) -> Metric:
        """(u_in + u_a g_N sf) |w| invstd D + u_in |dx|, D = |dy| + mean|dy| + |xhat| mean|dy xhat|."""
        b, x, truth, rank = self.budget, self.x, self.truth, self.rank
        if truth.mean_abs_dy and truth.mean_abs_dy[rank] is not None:
            # Means over the values normalized together (the normalization's N), from the oracle.
            mean_abs_dy, mean_abs_dyx = truth.mean_abs_dy[rank], truth.mean_abs_dy_xhat[rank]
        elif x.numel():
            # No group means given: this rank's share as an estimate.
            n = x.numel() // x.shape[1]
            mean_abs_dy, mean_abs_dyx = self.sums.abs_dy / n, self.sums.abs_dy_xhat / n
        else:
            mean_abs_dy = mean_abs_dyx = torch.zeros(self.case.channels, dtype=torch.float64)
        coef = (b.u_in + b.u_a * self.g_N * self.sf) * self.w.abs() * self.invstd
        coef_dy = coef
        rm_tol, rv_tol = self.running[0]
        if not self.train and rm_tol is not None:
            coef_dy = coef + self.w.abs() * 0.5 * rv_tol * self.invstd ** 3  # the running variance's budget, x |dy|
        tol = partial(_grad_input_tolerance, gin=truth.grad_input[rank], x=x, dy=self.dy, mu=self.mu,
                      invstd=self.invstd, c_gin=K * b.u_in, c_dy=_chan(K * coef_dy, x),
                      c_xhat=_chan(K * coef * mean_abs_dyx, x), c_one=_chan(K * coef * mean_abs_dy, x))
        return compare_tensor(obs["grad_input"], truth.grad_input[rank], tol, dtype=b.dtype)

    def parameters(self, obs: dict, shares: list) -> list[tuple[str, Metric]]:
        """grad_weight and grad_bias: the sums of the shares of the steps whose backward this one ran."""
        b = self.budget
        steps = obs.get("grad_steps") or [self.s]
        true_gw = sum(shares[i][0] for i in steps)
        true_gb = sum(shares[i][1] for i in steps)
        tol_gw = sum(shares[i][2] for i in steps) + b.u_p * true_gw.abs()
        tol_gb = sum(shares[i][3] for i in steps) + b.u_p * true_gb.abs()
        return [("grad_weight", compare_tensor(obs["grad_weight"], true_gw, K * tol_gw, dtype=b.pdtype)),
                ("grad_bias", compare_tensor(obs["grad_bias"], true_gb, K * tol_gb, dtype=b.pdtype))]

    def buffers(self, obs: dict) -> list[tuple[str, Metric]]:
        """running_mean and running_var under their budgets after this step; num_batches_tracked exactly."""
        b, truth, rank = self.budget, self.truth, self.rank
        rm_tol, rv_tol = self.running[1]
        out = [("running_mean", compare_tensor(obs["running_mean"], truth.running_mean[rank], K * rm_tol,
                                               dtype=b.pdtype)),
               ("running_var", compare_tensor(obs["running_var"], truth.running_var[rank], K * rv_tol,
                                              dtype=b.pdtype))]
        got, want = obs.get("num_batches_tracked"), truth.num_batches_tracked[rank]
        if got != want:
            out.append(("num_batches_tracked", Metric.failure(f"num_batches_tracked {got}, expected {want}")))
        return out


def _output_tolerance(a: int, e: int, *, y, x, mu, invstd, c_y: float, c_xhat, c_one) -> torch.Tensor:
    """The output's final tolerance on batch rows a:e: c_y |y| + c_xhat |xhat| + c_one (per-channel c's)."""
    return y[a:e].abs().mul_(c_y).addcmul_(_abs_xhat(x[a:e], mu, invstd), c_xhat).add_(c_one)


def _grad_input_tolerance(a: int, e: int, *, gin, x, dy, mu, invstd, c_gin: float, c_dy, c_xhat,
                          c_one) -> torch.Tensor:
    """The input gradient's final tolerance on batch rows a:e: c_gin |dx| + c_dy |dy| + c_xhat |xhat| + c_one."""
    abs_dy = dy[a:e].detach().to(torch.float64, copy=True).abs_()
    return gin[a:e].abs().mul_(c_gin).addcmul_(abs_dy, c_dy).addcmul_(_abs_xhat(x[a:e], mu, invstd), c_xhat).add_(
        c_one)


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
    """:func:`sum_tolerance` from the ranks' own budgets (``budgets``: each rank's from :func:`judge_rank`, in rank
    order) and ``|true sum|``: the same terms added in the same order, without any rank's tensors."""
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


def judge_sums(sum_truth: dict, shares: list[dict]) -> list[tuple[str, Metric]]:
    """Compare the sum over ranks of the grad_weight/grad_bias shares with the oracle's sum.

    ``sum_truth``: ``{step: {which: {"true": [...], "tol": [...]}}}`` (final
    tolerances, from :func:`sum_tolerance`); ``shares``: one
    ``{step: {which: [...]}}`` per rank.
    """
    out = []
    for step, truth in sum_truth.items():
        for which, t in truth.items():
            parts = [s[step][which] for s in shares if step in s]
            if len(parts) != len(shares):
                continue
            got = torch.tensor(parts, dtype=torch.float64).sum(0)
            true = torch.tensor(t["true"], dtype=torch.float64)
            # A share that overflowed its dtype was judged on its rank (infinity is right where the true share
            # is beyond the dtype's range, a failure elsewhere); its channel's sum carries nothing more.
            judged = torch.isfinite(torch.tensor(parts, dtype=torch.float64)).all(0)
            got = torch.where(judged, got, true)
            m = compare_tensor(got, true, torch.tensor(t["tol"], dtype=torch.float64))
            out.append((sum_key(step, which), m))
    return out
