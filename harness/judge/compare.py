"""Judgement: one implementation's tensors against the float64 oracle, under the budgets of
:mod:`harness.judge.budget`.

:func:`judge_rank` compares every tensor a rank observed at every step (output,
input gradient, its shares of the parameters' gradients, the running
statistics) with the oracle's, each under its elementwise tolerance built from
the budget a batch slice at a time; :func:`judge_sums` compares the sum over
ranks of the parameters' gradient shares with the oracle's sum, in the parent.
The formulas are the budget module's docstring.
"""

from __future__ import annotations

from functools import partial
from typing import Optional

import torch

from harness.catalog.case import Case
from harness.catalog.data import MEMORY_FORMATS
from harness.judge.budget import K, Budget, ShareSums, abs_xhat, gamma, per_channel, share_sums
from harness.judge.elementwise import compare_tensor
from harness.judge.metric import Metric
from harness.judge.metric_key import step_key, sum_key

__all__ = ["judge_rank", "judge_sums", "compare_tensor"]


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
    terms :func:`~harness.judge.budget.sum_tolerance_of` adds up over the ranks.
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
                      c_xhat=per_channel(K * coef_xhat, x), c_one=per_channel(K * coef_one, x))
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
                      invstd=self.invstd, c_gin=K * b.u_in, c_dy=per_channel(K * coef_dy, x),
                      c_xhat=per_channel(K * coef * mean_abs_dyx, x), c_one=per_channel(K * coef * mean_abs_dy, x))
        return compare_tensor(obs["grad_input"], truth.grad_input[rank], tol, dtype=b.dtype)

    def parameters(self, obs: dict, shares: list) -> list[tuple[str, Metric]]:
        """grad_weight and grad_bias (none without a bias): the sums of the shares of the steps whose backward
        this one ran."""
        b = self.budget
        steps = obs.get("grad_steps") or [self.s]
        true_gw = sum(shares[i][0] for i in steps)
        true_gb = sum(shares[i][1] for i in steps)
        tol_gw = sum(shares[i][2] for i in steps) + b.u_p * true_gw.abs()
        tol_gb = sum(shares[i][3] for i in steps) + b.u_p * true_gb.abs()
        out = [("grad_weight", compare_tensor(obs["grad_weight"], true_gw, K * tol_gw, dtype=b.pdtype))]
        if self.case.bias:  # without a bias (bias=False) there is no bias gradient to judge
            out.append(("grad_bias", compare_tensor(obs["grad_bias"], true_gb, K * tol_gb, dtype=b.pdtype)))
        return out

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
    return y[a:e].abs().mul_(c_y).addcmul_(abs_xhat(x[a:e], mu, invstd), c_xhat).add_(c_one)


def _grad_input_tolerance(a: int, e: int, *, gin, x, dy, mu, invstd, c_gin: float, c_dy, c_xhat,
                          c_one) -> torch.Tensor:
    """The input gradient's final tolerance on batch rows a:e: c_gin |dx| + c_dy |dy| + c_xhat |xhat| + c_one."""
    abs_dy = dy[a:e].detach().to(torch.float64, copy=True).abs_()
    return gin[a:e].abs().mul_(c_gin).addcmul_(abs_dy, c_dy).addcmul_(abs_xhat(x[a:e], mu, invstd), c_xhat).add_(
        c_one)


def judge_sums(sum_truth: dict, shares: list[dict]) -> list[tuple[str, Metric]]:
    """Compare the sum over ranks of the grad_weight/grad_bias shares with the oracle's sum.

    ``sum_truth``: ``{step: {which: {"true": [...], "tol": [...]}}}`` (final
    tolerances, from :func:`~harness.judge.budget.sum_tolerance`); ``shares``: one
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
