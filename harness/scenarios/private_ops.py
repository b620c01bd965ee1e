"""The private_ops scenario: one of torch's five private SyncBN ops, called on a case's fixed inputs, judged.

Why: horovod's SyncBN (horovod#1980), apex and detectron2 call ``torch.batch_norm_stats``,
``torch.batch_norm_gather_stats_with_counts``, ``torch.batch_norm_elemt``, ``torch.batch_norm_backward_reduce``
and ``torch.batch_norm_backward_elemt`` themselves. When a build changes one's schema (horovod raised after 1.5
and 1.9, pytorch#57900) or what it computes (the counts' dtype, pytorch#98332; half partial sums, pytorch#195701;
what an empty input gives), those callers break without a word; the layer cases may not notice, since torch's own
Function changes with its ops. A record per op and build makes ``syncbn-harness diff`` show the change.

Protocol, per rank (``Case.op`` is ``(op, *options)``):
1. The case's tensors (:func:`~harness.catalog.data.materialize`: every rank's input and upstream gradient, the
   parameters and running statistics) and their float64 statistics: per rank and over the group, the count, mean
   and biased variance of each channel. (The layer's oracle is not needed: :mod:`~harness.scenarios.prepared` is
   not used.)
2. The op's arguments, as torch's SyncBatchNorm Function builds them (torch/nn/modules/_functions.py), from exact
   statistics rounded to their dtypes, never from another op's output (so a change of one op fails its own
   cases alone):
   - ``batch_norm_stats(input, eps)``: this rank's input (empty on an empty rank);
   - ``batch_norm_gather_stats_with_counts(input, mean, invstd, running_mean, running_var, momentum, eps,
     counts)``: every rank's row, statistics in acc(input) as the all_gather brings them, an empty rank's row
     zeros with count 0 (what the Function sends, and passes on under CUDA graph capture), the counts in the
     running statistics' dtype (pytorch#98332), copies of the case's running statistics;
   - ``batch_norm_elemt(input, weight, bias, mean, invstd, eps)``: the group's mean and invstd in acc(input);
   - ``batch_norm_backward_reduce(grad_out, input, mean, invstd, weight, True, True, True)``;
   - ``batch_norm_backward_elemt(grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu, count)``: the weight
     in the mean's dtype, the group's sums in it, every rank's count as int32 [W, 1].
   Option ``loss-scaled``: the upstream gradient is ``2**16 (2**-9 + 2**-11 dy)``, what GradScaler's initial
   scale makes of a gradient of mean 2**-9, rounded to the input dtype.
3. The op is called positionally, as its callers call it: a changed schema raises (a ``TypeError``, an
   ``error`` record), a changed computation fails its outputs (a ``mismatch``).
4. Each output, and the running statistics the gather updates in place, against the op's float64 contract
   (:mod:`harness.judge.private_ops`): dtype, shape, memory format and values, metrics ``<op>.<output>``.

The ops come from the implementation (:meth:`harness.impls.base.Impl.private_ops`): torch's own (CUDA's kernels on
``cuda``; on CPU the cpu-emulation's, :mod:`harness.impls.torch_emulation`), the reference's ``torch.ops.syncbn_ref``
(the same contract, its own kernels), a plugin's; an implementation without them is ``unsupported``. No
collective is issued: each rank is handed what the all_gather and all_reduce would have brought.
"""

from __future__ import annotations

from typing import Optional

import torch

from harness.catalog.case import Case
from harness.catalog.data import CaseData, materialize
from harness.judge import private_ops as contract

LOSS_SCALE = 2.0**16  # GradScaler's initial scale
GRAD_MEAN, GRAD_SPREAD = 2.0**-9, 2.0**-11  # the loss-scaled case's gradient before scaling: mean and spread


def unsupported_reason(case: Case, impl, device: str, backend: str) -> Optional[str]:
    """Why ``impl`` cannot run ``case``: it has no ops of this contract (None: it has)."""
    if impl.private_ops() is None:
        return (f"{impl.name} has no ops of torch's private SyncBN contract ({case.op[0]} and the rest are torch's "
                "ATen ops: --impl torch runs them, --impl reference the reference's own)")
    return None


def run_rank(ctx, case: Case, impl, device: str, result, compare_with: Optional[str] = None) -> None:
    """Call ``case``'s op with ``impl``'s ops on this rank's arguments and fill ``result`` with its judged outputs."""
    if compare_with:
        raise ValueError("--compare is not supported by the private_ops scenario: run each implementation alone")
    op = case.op[0]
    data = materialize(case)
    args = arguments(case, data, ctx.rank, device)
    returned = getattr(impl.private_ops(), op)(*args)
    result.metrics = dict(contract.judge(op, expect(case, data, args), observed(op, args, returned)))


def judge_across(case: Case, results: list) -> list:
    """Nothing is judged across ranks: each rank's op is judged on its own."""
    return []


class _Group:
    """The float64 statistics of every rank's input and of the group's, per channel."""

    def __init__(self, xs: list[torch.Tensor]):
        self.counts = [x.numel() // x.shape[1] for x in xs]
        rows = [x.detach().to(torch.float64).transpose(0, 1).reshape(x.shape[1], -1) for x in xs]
        every = torch.cat(rows, dim=1)
        self.means = [r.mean(1) if r.shape[1] else torch.zeros(r.shape[0], dtype=torch.float64) for r in rows]
        self.vars = [r.var(1, unbiased=False) if r.shape[1] else torch.zeros(r.shape[0], dtype=torch.float64)
                     for r in rows]
        self.mean = every.mean(1)
        self.var = every.var(1, unbiased=False)


def _grads(case: Case, data) -> list[torch.Tensor]:
    """Every rank's upstream gradient (the loss-scaled one where the case asks for it)."""
    gs = data.grad_outputs[0]
    if "loss-scaled" not in case.op[1:]:
        return gs
    return [(LOSS_SCALE * (GRAD_MEAN + GRAD_SPREAD * g.to(torch.float64))).to(g.dtype) for g in gs]


def arguments(case: Case, data: CaseData, rank: int, device: str) -> tuple:
    """The op's positional arguments on this rank (see the module docstring), on ``device``, from the case's
    tensors ``data`` (left as they are: the gather gets copies of the running statistics)."""
    op, eps = case.op[0], case.eps
    xs = data.inputs[0]
    x = xs[rank].to(device)
    acc = contract.acc(x.dtype)
    group = _Group(xs)
    if op == "batch_norm_stats":
        return x, eps
    stat_mean = group.mean.to(acc).to(device)
    stat_invstd = (1.0 / torch.sqrt(group.var + eps)).to(acc).to(device)
    if op == "batch_norm_gather_stats_with_counts":
        empty = [n == 0 for n in group.counts]
        means = torch.stack([torch.zeros_like(m) if e else m for m, e in zip(group.means, empty)]).to(acc)
        invstds = torch.stack([torch.zeros_like(v) if e else 1.0 / torch.sqrt(v + eps)
                               for v, e in zip(group.vars, empty)]).to(acc)
        counts = torch.tensor(group.counts, dtype=torch.float64).to(data.running_mean.dtype)
        momentum = 1.0 if case.momentum is None else case.momentum  # None: the cumulative factor of a first step
        return (x, means.to(device), invstds.to(device), data.running_mean.clone().to(device),
                data.running_var.clone().to(device), momentum, eps, counts.to(device))
    weight, bias = data.weight.to(device), data.bias.to(device)
    if op == "batch_norm_elemt":
        return x, weight, bias, stat_mean, stat_invstd, eps
    gs = _grads(case, data)
    g = gs[rank].to(device)
    if op == "batch_norm_backward_reduce":
        return g, x, stat_mean, stat_invstd, weight, True, True, True
    mu = group.mean.view(1, -1)
    sums = [(gr.to(torch.float64).transpose(0, 1).reshape(case.channels, -1),
             xr.to(torch.float64).transpose(0, 1).reshape(case.channels, -1)) for gr, xr in zip(gs, xs)]
    sum_dy = sum(gd.sum(1) for gd, _ in sums).to(acc).to(device)
    sum_dy_xmu = sum((gd * (xd - mu.T)).sum(1) for gd, xd in sums).to(acc).to(device)
    count = torch.tensor(group.counts, dtype=torch.int32).view(-1, 1).to(device)
    return g, x, stat_mean, stat_invstd, weight.to(acc), sum_dy, sum_dy_xmu, count


def expect(case: Case, data: CaseData, args: tuple) -> dict[str, contract.Expected]:
    """The op's outputs by its float64 contract, from the arguments it was given (the running statistics as they
    were before the call: ``data``'s, of which the gather got copies), on the CPU."""
    op = case.op[0]
    args = tuple(a.cpu() if isinstance(a, torch.Tensor) else a for a in args)
    if op == "batch_norm_stats":
        return contract.stats(args[0], args[1])
    if op == "batch_norm_gather_stats_with_counts":
        x, means, invstds, _, _, momentum, eps, counts = args
        return contract.gather(x.dtype, means, invstds, counts, data.running_mean, data.running_var, momentum, eps)
    if op == "batch_norm_elemt":
        return contract.elemt(*args[:5])
    if op == "batch_norm_backward_reduce":
        return contract.backward_reduce(*args[:5])
    return contract.backward_elemt(*args)


def observed(op: str, args: tuple, returned) -> dict[str, Optional[torch.Tensor]]:
    """What the op gave, by output name, on the CPU (the gather's running statistics as it left them)."""
    outs = returned if isinstance(returned, (tuple, list)) else (returned,)
    names = contract.OUTPUTS[op]
    got = {name: _cpu(t) for name, t in zip(names, outs)}
    if len(outs) != len(names):
        got = {name: None for name in names}  # a changed number of outputs: none of them is the contract's
    if op == "batch_norm_gather_stats_with_counts":
        got["running_mean"], got["running_var"] = _cpu(args[3]), _cpu(args[4])
    return got


def _cpu(t) -> Optional[torch.Tensor]:
    return t.detach().cpu() if isinstance(t, torch.Tensor) else None

