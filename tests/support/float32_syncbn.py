"""A third correct SyncBN, accumulating in float32 as the CUDA kernels of torch and apex do.

Statistics, their merge across ranks, the backward sums and every
elementwise step are computed in float32 (float64 only for float64 input);
results are rounded to the input dtype (output, grad_input) and the
parameter dtype (running statistics, grad_weight, grad_bias). Per rank:
(count, mean, M2) by a two-pass over the rank's batch, one all_gather of
those rows in float32, then the merge torch's CUDA kernel uses (the mean as
a count-weighted average, whose rounding moves even a constant channel's
mean off its value); backward: the local (sum_dy, sum_dy_xmu), one
all_reduce, the closed-form input gradient.

Written from the batch-norm formulas alone: it shares no code with the
reference, textbook.py or gather.py. The judgement must raise no alarm on it
(a correct implementation's float32 rounding is not a defect).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn



def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _dims(x: torch.Tensor) -> list[int]:
    return [0] + list(range(2, x.dim()))


def _per_channel(v: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return v.reshape(1, -1, *([1] * (x.dim() - 2)))


class _TrainFn(torch.autograd.Function):
    """Training-mode normalization over the group (statistics synchronized), with a hand-written backward."""

    @staticmethod
    def forward(ctx, x, weight, bias, owner, group, sync):
        acc = _acc(x.dtype)
        c = x.shape[1]
        xa = x.to(acc)
        n = x.numel() // c if c else 0
        if n:
            mean = xa.mean(_dims(x))
            m2 = ((xa - _per_channel(mean, x)) ** 2).sum(_dims(x))
        else:
            mean = torch.zeros(c, dtype=acc)
            m2 = torch.zeros(c, dtype=acc)
        if sync:
            row = torch.cat([torch.tensor([float(n)], dtype=acc), mean, m2])
            rows = [torch.empty_like(row) for _ in range(dist.get_world_size(group))]
            dist.all_gather(rows, row, group=group)
            total = torch.zeros((), dtype=acc)
            mean = torch.zeros(c, dtype=acc)
            m2 = torch.zeros(c, dtype=acc)
            for r in rows:  # merged in rank order, as torch's CUDA gather does: a weighted average of the means
                nb = r[0]
                if float(nb) <= 0:
                    continue
                factor = 1.0 / (total + nb)
                delta = r[1:1 + c] - mean
                m2 = m2 + r[1 + c:] + delta * delta * (total * nb * factor)
                mean = (total * factor) * mean + (nb * factor) * r[1:1 + c]
                total = total + nb
            count = float(total)
        else:
            count = float(n)
        if count == 1:
            raise ValueError("Expected more than 1 value per channel when training (over the group)")
        invstd = torch.rsqrt(m2 / max(count, 1.0) + torch.tensor(owner.eps, dtype=acc))
        owner.update_running(mean, m2, count)
        w = weight.to(acc) if weight is not None else torch.ones(c, dtype=acc)
        b = bias.to(acc) if bias is not None else torch.zeros(c, dtype=acc)
        xmu = xa - _per_channel(mean, x)
        y = xmu * _per_channel(invstd * w, x) + _per_channel(b, x)
        ctx.save_for_backward(xmu, invstd, w)
        ctx.count, ctx.group, ctx.sync, ctx.owner = count, group, sync, owner
        ctx.in_dtype, ctx.has_weight = x.dtype, weight is not None
        ctx.w_dtype = weight.dtype if weight is not None else None
        return y.to(x.dtype)  # elementwise ops and the cast keep the input's memory format

    @staticmethod
    def backward(ctx, dy):
        xmu, invstd, w = ctx.saved_tensors
        acc = xmu.dtype
        dya = dy.to(acc)
        sum_dy, sum_dy_xmu = ctx.owner.grad_sums(dy, dya, xmu)
        grad_w = grad_b = None
        if ctx.has_weight:
            grad_w = (sum_dy_xmu * invstd).to(ctx.w_dtype)
            grad_b = sum_dy.to(ctx.w_dtype)
        if ctx.sync:
            both = torch.cat([sum_dy, sum_dy_xmu])
            dist.all_reduce(both, group=ctx.group)
            sum_dy, sum_dy_xmu = both[:len(sum_dy)], both[len(sum_dy):]
        count = max(ctx.count, 1.0)
        mean_dy = sum_dy / count
        proj = sum_dy_xmu / count * invstd * invstd
        dx = (dya - _per_channel(mean_dy, dya) - xmu * _per_channel(proj, dya)) * _per_channel(invstd * w, dya)
        return dx.to(ctx.in_dtype), grad_w, grad_b, None, None, None


class Float32SyncBN(nn.Module):
    """SyncBatchNorm's semantics with float32 arithmetic throughout."""

    # Declared as a plain dict: this file runs where the harness is not installed (repro tests).
    capabilities = {"convert": True, "double_backward": False, "script": False}

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 process_group=None):
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats, self.process_group = affine, track_running_stats, process_group
        if affine:
            self.weight = nn.Parameter(torch.ones(num_features))
            self.bias = nn.Parameter(torch.zeros(num_features))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", torch.zeros(num_features))
            self.register_buffer("running_var", torch.ones(num_features))
            self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))
        else:
            self.running_mean = self.running_var = self.num_batches_tracked = None
        self._factor = 0.0

    def update_running(self, mean, m2, count):
        """Called by the training function with the group's statistics (in float32)."""
        if not (self.training and self.track_running_stats) or count < 1:
            return
        with torch.no_grad():
            f = self._factor
            acc = mean.dtype
            unbiased = m2 / (count - 1) if count > 1 else torch.full_like(m2, float("inf"))
            rm = self.running_mean.to(acc) * (1 - f) + mean * f
            rv = self.running_var.to(acc) * (1 - f) + unbiased * f
            self.running_mean.copy_(rm)
            self.running_var.copy_(rv)

    def grad_sums(self, dy, dya, xmu):
        """The rank's per-channel (sum of dy, sum of dy * (x - mean)) in the accumulation type (``dya``: dy in
        it); called by the backward."""
        return dya.sum(_dims(dya)), (dya * xmu).sum(_dims(dya))

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # As nn.BatchNorm loads one: a state dict without the count (hand-built, or older than it) keeps this
        # layer's count, a real 0 where that is a meta tensor (a layer built on the meta device).
        key = prefix + "num_batches_tracked"
        if self.track_running_stats and key not in state_dict:
            own = self.num_batches_tracked
            state_dict[key] = own if own is not None and own.device.type != "meta" else torch.tensor(0,
                                                                                                     dtype=torch.long)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def forward(self, x):
        if x.dim() < 2 or x.shape[1] != self.num_features:
            raise ValueError(f"expected (N, {self.num_features}, ...) input, got {tuple(x.shape)}")
        if self.training and self.track_running_stats:
            self.num_batches_tracked += 1
            self._factor = 1.0 / int(self.num_batches_tracked) if self.momentum is None else self.momentum
        if not self.training and self.running_mean is not None:  # buffers there: eval uses them, as nn.BatchNorm
            acc = _acc(x.dtype)
            invstd = torch.rsqrt(self.running_var.to(acc) + self.eps)
            w = self.weight.to(acc) if self.affine else torch.ones(self.num_features, dtype=acc)
            b = self.bias.to(acc) if self.affine else torch.zeros(self.num_features, dtype=acc)
            y = (x.to(acc) - _per_channel(self.running_mean.to(acc), x)) * _per_channel(invstd * w, x) \
                + _per_channel(b, x)
            return y.to(x.dtype)
        group = self.process_group if self.process_group is not None else dist.group.WORLD
        sync = self.training and dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1
        return _TrainFn.apply(x, self.weight, self.bias, self, group, sync)

    @classmethod
    def convert_sync_batchnorm(cls, module, process_group=None):
        """Every BatchNorm*d of ``module`` becomes this class, sharing its parameters and buffers."""
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            out = cls(module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats,
                      process_group)
            if module.affine:
                out.weight, out.bias = module.weight, module.bias
            if module.track_running_stats:
                out.running_mean, out.running_var = module.running_mean, module.running_var
                out.num_batches_tracked = module.num_batches_tracked
            out.train(module.training)
            return out
        for name, child in module.named_children():
            module.add_module(name, cls.convert_sync_batchnorm(child, process_group))
        return module
