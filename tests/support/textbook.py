"""A correct SyncBN written independently of the reference: plain torch, autograd through collectives.

Statistics are two all_reduces in float64 (count and sum, then the sum of
squared deviations from the global mean), through
``torch.distributed.nn.functional.all_reduce``, which is differentiable: the
backward pass is derived by autograd, so it shares no code or formula with the
reference's hand-written backward. Used as a plugin (``textbook:TextbookSyncBN``)
to prove the judgement raises no false alarm, and as the base of planted defects.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.nn.functional import all_reduce as diff_all_reduce
from torch.nn.modules.batchnorm import _BatchNorm



class TextbookSyncBN(_BatchNorm):
    """SyncBatchNorm's semantics in ~60 lines of float64 torch."""

    # Declared as a plain dict: this file runs where the harness is not installed (repro tests).
    capabilities = {"convert": True, "script": False, "revert": True}

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 process_group=None, *, bias=True, device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)
        if affine and not bias:  # a weight without a bias, as nn.BatchNorm's bias=False
            self.bias = None
        self.process_group = process_group

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    # Hooks the planted defects override -------------------------------------------------------
    def group(self):
        return self.process_group or dist.group.WORLD

    def momentum_factor(self):
        if self.momentum is None:
            return 1.0 / float(self.num_batches_tracked)
        return self.momentum

    def count_batches(self):
        self.num_batches_tracked.add_(1)

    def reduce(self, t):
        if dist.get_world_size(self.group()) == 1:  # a group of one has nothing to synchronize
            return t
        return diff_all_reduce(t, group=self.group())

    def batch_stats(self, x, dims):
        """Global (mean, biased var, count) in float64, differentiable."""
        xd = x.double()
        c = x.shape[1]
        n_local = torch.full((1,), x.numel() / c, dtype=torch.float64)
        both = self.reduce(torch.cat([n_local, xd.sum(dims)]))
        n, mean = both[0], both[1:] / both[0]
        d = xd - mean.view(self.shape(x))
        var = self.reduce((d * d).sum(dims)) / n
        return mean, var, n

    def normalize(self, x, mean, var):
        s = self.shape(x)
        return (x.double() - mean.view(s)) / torch.sqrt(var.view(s) + self.eps)

    def finish(self, x, y):
        return y.to(x.dtype)

    # ------------------------------------------------------------------------------------------
    @staticmethod
    def shape(x):
        return [1, x.shape[1]] + [1] * (x.dim() - 2)

    def forward(self, x):
        self._check_input_dim(x)
        dims = [0] + list(range(2, x.dim()))
        factor = 0.0
        if self.training and self.track_running_stats:
            self.count_batches()
            factor = self.momentum_factor()
        if self.training or self.running_mean is None:
            if self.training and dist.is_initialized():
                mean, var, n = self.batch_stats(x, dims)
            else:
                xd = x.double()
                mean, var, n = xd.mean(dims), xd.var(dims, unbiased=False), x.numel() / x.shape[1]
            if self.training and float(n) == 1:
                raise ValueError("Expected more than 1 value per channel when training (over the group)")
            if self.training and self.track_running_stats and float(n) > 0:
                self.update_running(mean.detach(), var.detach(), float(n), factor)
        else:
            mean, var = self.running_mean.double(), self.running_var.double()
        y = self.normalize(x, mean, var)
        if self.affine:
            s = self.shape(x)
            y = y * self.weight.double().view(s)
            if self.bias is not None:
                y = y + self.bias.double().view(s)
        return self.finish(x, y)

    def update_running(self, mean, var, n, factor):
        with torch.no_grad():
            unbiased = var * n / (n - 1) if n > 1 else torch.full_like(var, float("inf"))
            self.running_mean.copy_((1 - factor) * self.running_mean.double() + factor * mean)
            self.running_var.copy_((1 - factor) * self.running_var.double() + factor * unbiased)

    @classmethod
    def convert_sync_batchnorm(cls, module, process_group=None):
        out = module
        if isinstance(module, _BatchNorm) and not isinstance(module, cls):
            out = cls(module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats,
                      process_group)
            if module.affine:
                out.weight, out.bias = module.weight, module.bias
            out.running_mean, out.running_var = module.running_mean, module.running_var
            out.num_batches_tracked = module.num_batches_tracked
            out.training = module.training
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child, process_group))
        return out

    @classmethod
    def revert_sync_batchnorm(cls, module):
        """Each layer of this class back to a BatchNorm: a new module over the same tensors, with its flags."""
        out = module
        if isinstance(module, cls):
            out = Reverted(module.num_features, module.eps, module.momentum, module.affine,
                           module.track_running_stats)
            for name in ("weight", "bias"):
                out.register_parameter(name, getattr(module, name))
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                out.register_buffer(name, getattr(module, name))
            out.training = module.training
        for name, child in module.named_children():
            out.add_module(name, cls.revert_sync_batchnorm(child))
        return out


class Reverted(_BatchNorm):
    """BatchNorm of any input of 2 dimensions or more: what the textbook revert makes."""

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")
