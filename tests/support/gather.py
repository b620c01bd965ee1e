"""A second correct SyncBN, written like torch's algorithm but in Python: an explicit autograd Function.

Forward: each rank's (count, mean, M2) in float64, one all_gather, a
count-weighted merge in Python; backward: local (sum_dy, sum_dy_xmu), one
all_reduce, the closed-form input gradient. No reference kernels, no autograd
through collectives: independent of both the reference and textbook.py.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from textbook import TextbookSyncBN


class _GatherFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, eps, hooks):
        c = x.shape[1]
        dims = [0] + list(range(2, x.dim()))
        shape = [1, c] + [1] * (x.dim() - 2)
        xd = x.detach().double()
        n = x.numel() // c
        mean = xd.mean(dims) if n else torch.zeros(c, dtype=torch.float64)
        m2 = ((xd - mean.view(shape)) ** 2).sum(dims) if n else torch.zeros(c, dtype=torch.float64)
        row = torch.cat([torch.tensor([float(n)], dtype=torch.float64), mean, m2])
        rows = [torch.empty_like(row) for _ in range(dist.get_world_size(group))]
        dist.all_gather(rows, row, group=group)
        rows = torch.stack(rows)
        counts, means, m2s = rows[:, 0], rows[:, 1:1 + c], rows[:, 1 + c:]
        total = counts.sum()
        gmean = (counts[:, None] * means).sum(0) / total
        gm2 = (m2s + counts[:, None] * (means - gmean) ** 2).sum(0)
        var = gm2 / total
        invstd = 1.0 / torch.sqrt(var + eps)
        ctx.save_for_backward(xd, gmean, invstd)
        ctx.group, ctx.total, ctx.hooks = group, float(total), hooks
        return (xd - gmean.view(shape)) * invstd.view(shape), gmean, var, total

    @staticmethod
    def backward(ctx, grad_xhat, _gm, _gv, _gt):
        xd, mean, invstd = ctx.saved_tensors
        c = xd.shape[1]
        dims = [0] + list(range(2, xd.dim()))
        shape = [1, c] + [1] * (xd.dim() - 2)
        g = grad_xhat.double()
        xhat = (xd - mean.view(shape)) * invstd.view(shape)
        sums = torch.cat([g.sum(dims), (g * xhat).sum(dims)])
        dist.all_reduce(sums, group=ctx.group)
        sum_g, sum_gx = sums[:c], sums[c:]
        total = ctx.hooks.backward_count(ctx.total, xd)
        gin = (g - (sum_g / total).view(shape) - xhat * (sum_gx / total).view(shape)) * invstd.view(shape)
        return gin, None, None, None


class GatherSyncBN(TextbookSyncBN):
    """SyncBatchNorm through an all_gather of per-rank moments and a hand-written backward."""

    def backward_count(self, total, x):
        return total

    def forward(self, x):
        if not (self.training and dist.is_initialized()):
            return super().forward(x)
        self._check_input_dim(x)
        factor = 0.0
        if self.track_running_stats:
            self.count_batches()
            factor = self.momentum_factor()
        xhat, mean, var, total = _GatherFn.apply(x, self.group(), self.eps, self)
        if self.track_running_stats:
            self.update_running(mean.detach(), var.detach(), float(total), factor)
        y = xhat
        if self.affine:
            s = self.shape(x)
            y = y * self.weight.double().view(s) + self.bias.double().view(s)
        return self.finish(x, y)
