"""The reference implementation: our SyncBatchNorm on the ``syncbn_ref`` kernels, and its adapter.

Forward (training), per rank:
1. ``welford_stats``: this rank's (count, mean, M2) per channel in float64,
   packed as one [2C+1] tensor whatever the input dtype.
2. One ``all_gather`` of those rows over the process group.
3. ``welford_merge``: Chan's merge in float64; empty ranks contribute nothing.
4. ``welford_finish``: the float64 mean and 1/std, and the running statistics
   updated in place (unbiased variance of the global count, in the buffers'
   dtype), on the device from the merged row; an all-empty group leaves them
   as they were (mean 0, 1/std 1).
5. ``batch_norm_elemt`` with the float64 mean and 1/std: output in the input
   dtype and memory format.

Backward: ``batch_norm_backward_reduce`` gives the local (sum_dy, sum_dy_xmu)
in float64, one ``all_reduce`` sums them over the group, and
``batch_norm_backward_elemt`` divides by the global count (a device tensor,
summed inside the kernel). grad_weight and grad_bias are each rank's local
share (summing them is the job of DDP).

Eval uses the running statistics with no communication; without running
statistics it normalizes with the rank's own batch, like torch's module.

No host sync in a training step on a rank with 2 or more values per channel of
its own (then the global count is at least 2): such a step can be captured in
a CUDA graph (capabilities: ``graph_capture=True``), with no process group, a
group of one, or over nccl. A rank with 0 or 1 values of its own reads the
global count to the host to raise nn.BatchNorm's "Expected more than 1 value
per channel" when the whole group has 1; under capture it cannot read it, so
there a global count of 1 gives NaN output and leaves the running statistics as
they were (an all-empty group is handled on the device either way).
``momentum=None`` reads ``num_batches_tracked`` on the host, as torch's module
does. ``torch.compile`` with ``fullgraph=True`` is not supported (capabilities:
``fullgraph=False``): the autograd Function and the host read above break the
graph.

``bias=False`` keeps the weight and has no bias (no shift, no bias gradient),
as ``nn.BatchNorm`` with that keyword. ``SyncBatchNorm.revert_sync_batchnorm``
turns converted layers back into the BatchNorms they were (the same objects
under their original classes).
"""

from __future__ import annotations

import copy
from typing import Optional

import torch
import torch.distributed as dist
from torch import Tensor
from torch.nn.modules.batchnorm import _BatchNorm, _LazyNormBase

from harness.catalog.case import Case
from harness.errors import ImplUnavailable, KernelBuildError
from harness.impls.base import Capabilities, Impl, construct_like_syncbn
from harness.kernels import extension


def _ops():
    extension.load()
    return torch.ops.syncbn_ref


def _capturing(t: Tensor) -> bool:
    """Whether ``t``'s stream is being captured into a CUDA graph (where no host read is allowed)."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                running_mean: Optional[Tensor], running_var: Optional[Tensor], eps: float, momentum: float,
                process_group, sync: bool):
        ops = _ops()
        stats = ops.welford_stats(input)
        if sync:
            world = dist.get_world_size(process_group)
            rows = [torch.empty_like(stats) for _ in range(world)]
            dist.all_gather(rows, stats, group=process_group)
            merged = ops.welford_merge(torch.stack(rows))
        else:
            merged = stats
        c = input.shape[1]
        count = merged[0]
        local = input.numel() // c if c else 0
        if local < 2 and not _capturing(input):
            # Only a rank with fewer than 2 values of its own can be in a group with 1 value per channel in all:
            # the host read of the global count (a sync on a GPU) is paid on such ranks alone.
            if float(count) == 1:
                # What nn.BatchNorm refuses over the same global batch (the buffers stay as they were).
                raise ValueError(f"Expected more than 1 value per channel when training, got 1 value per channel "
                                 f"over the process group (input of shape {tuple(input.shape)} on this rank)")
        mean, invstd = ops.welford_finish(merged, running_mean, running_var, momentum, eps)
        # The global count is at least 2 where this rank has 2 values; elsewhere it may be 0 (an all-empty group),
        # which batch_norm_backward_elemt must not divide by.
        saved_count = count.reshape(1) if local >= 2 else count.clamp(min=1).reshape(1)
        ctx.save_for_backward(input, weight, mean, invstd, saved_count)
        ctx.process_group = process_group
        ctx.sync = sync
        return ops.batch_norm_elemt(input, weight, bias, mean, invstd, eps)

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        ops = _ops()
        input, weight, mean, invstd, count = ctx.saved_tensors
        need_in, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        sum_dy, sum_dy_xmu, grad_w, grad_b = ops.batch_norm_backward_reduce(
            grad_output, input, mean, invstd, weight, True, need_w and weight is not None,
            need_b and weight is not None)
        grad_in = None
        if need_in:
            if ctx.sync:
                both = torch.cat([sum_dy, sum_dy_xmu])
                dist.all_reduce(both, group=ctx.process_group)
                sum_dy, sum_dy_xmu = both.split(sum_dy.numel())
            grad_in = ops.batch_norm_backward_elemt(grad_output, input, mean, invstd, weight, sum_dy, sum_dy_xmu,
                                                    count)
        return grad_in, grad_w, grad_b, None, None, None, None, None, None


class _EvalFunction(torch.autograd.Function):
    """Normalization with fixed statistics: no reduction over the batch in either direction."""

    @staticmethod
    def forward(ctx, input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], mean: Tensor, invstd: Tensor):
        ops = _ops()
        ctx.save_for_backward(input, weight, mean, invstd)
        return ops.batch_norm_elemt(input, weight, bias, mean, invstd, 0.0)

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        ops = _ops()
        input, weight, mean, invstd = ctx.saved_tensors
        need_w = ctx.needs_input_grad[1] and weight is not None
        need_b = ctx.needs_input_grad[2] and weight is not None
        zeros, _, grad_w, grad_b = ops.batch_norm_backward_reduce(grad_output, input, mean, invstd, weight, True,
                                                                  need_w, need_b)
        grad_in = None
        if ctx.needs_input_grad[0]:
            # With zero sums the backward of the training formula is dy * invstd * weight.
            zeros = torch.zeros_like(zeros)
            grad_in = ops.batch_norm_backward_elemt(grad_output, input, mean, invstd, weight, zeros, zeros,
                                                    torch.ones(1, dtype=torch.float64))
        return grad_in, grad_w, grad_b, None, None


class SyncBatchNorm(_BatchNorm):
    """Reference SyncBN with ``torch.nn.SyncBatchNorm``'s constructor and semantics."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1, affine: bool = True,
                 track_running_stats: bool = True, process_group=None, device=None, dtype=None, *, bias: bool = True):
        # The keyword is not passed on: BatchNorm before pytorch#176573 has none. bias=False keeps the weight and
        # registers no bias (None), as nn.BatchNorm does; the kernels take a weight without a bias (no shift).
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)
        if affine and not bias:
            self.bias = None
        self.process_group = process_group

    @classmethod
    def convert_sync_batchnorm(cls, module: torch.nn.Module, process_group=None) -> torch.nn.Module:
        """Replace every BatchNorm of ``module`` (recursively) with this SyncBN, changing nothing else.

        Parameters and buffers are shared (the same tensors, so values and requires_grad carry over);
        each converted layer keeps its training flag and qconfig; a module registered at several places
        becomes one converted module; a BatchNorm subclass keeps its own behaviour (the converted layer
        is of a class derived from both, so the subclass's forward runs around this one's); a lazy
        BatchNorm stays lazy and becomes this SyncBN when its first input arrives.
        """
        return _convert(cls, module, process_group, {})

    @classmethod
    def revert_sync_batchnorm(cls, module: torch.nn.Module) -> torch.nn.Module:
        """Turn every layer of this SyncBN in ``module`` back into a BatchNorm, in place; returns ``module``.

        Each layer stays the same object under the class it was converted from (a subclass keeps its own,
        a lazy layer that has seen its input becomes what its class becomes), so its parameters, buffers,
        training flag, qconfig, hooks and every other attribute stay as they are, and a module registered
        at several places stays one module; it loses only its process group. A layer built as this SyncBN
        (not converted) becomes a :class:`BatchNormNd`.
        """
        for m in list(module.modules()):
            if isinstance(m, cls):
                m.__class__ = _reverted_class(m)
                m.__dict__.pop("process_group", None)
                m.__dict__.pop("_converted_from", None)
        return module

    def _check_input_dim(self, input: Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: Tensor) -> Tensor:
        self._check_input_dim(input)
        if input.shape[1] != self.num_features:
            raise ValueError(f"expected {self.num_features} channels, got input of shape {tuple(input.shape)}")
        factor = 0.0
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        if not self.training and self.running_mean is not None:
            invstd = torch.rsqrt(self.running_var.double() + self.eps)
            return _EvalFunction.apply(input, self.weight, self.bias, self.running_mean.double(), invstd)
        sync = self.training and dist.is_available() and dist.is_initialized()
        group = self.process_group if self.process_group is not None else (dist.group.WORLD if sync else None)
        if sync and dist.get_world_size(group) < 2:
            sync = False
        track = self.training and self.track_running_stats
        return _SyncBatchNormFunction.apply(input, self.weight, self.bias,
                                            self.running_mean if track else None,
                                            self.running_var if track else None,
                                            self.eps, factor, group, sync)


def _convert(cls, module: torch.nn.Module, process_group, done: dict) -> torch.nn.Module:
    if id(module) in done:
        return done[id(module)]
    out = module
    if isinstance(module, _BatchNorm) and not isinstance(module, cls):
        out = _converted_layer(cls, module, process_group)
    done[id(module)] = out
    for name, child in list(module.named_children()):
        out.add_module(name, _convert(cls, child, process_group, done))
    return out


def _converted_layer(cls, module: _BatchNorm, process_group) -> _BatchNorm:
    kind = type(module)
    if isinstance(module, _LazyNormBase) and module.has_uninitialized_params():
        lazy = type(f"Lazy{cls.__name__}", (kind, cls), {"cls_to_become": cls})
        out = lazy(module.eps, module.momentum, module.affine, module.track_running_stats)
    elif kind in _PLAIN:
        out = cls(module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats)
    else:
        # A subclass: the same object's state under a class that derives from both, so the subclass's
        # forward (an activation after normalization, say) still runs, around this SyncBN's.
        derived = _derived(kind, cls)
        out = derived.__new__(derived)
        torch.nn.Module.__init__(out)
        out.__dict__.update({k: (copy.copy(v) if isinstance(v, (dict, set)) else v)
                             for k, v in module.__dict__.items() if k not in ("_parameters", "_buffers", "_modules")})
    for name, p in module._parameters.items():
        out.register_parameter(name, p)
    for name, b in module._buffers.items():
        out.register_buffer(name, b, persistent=name not in module._non_persistent_buffers_set)
    out.process_group = process_group
    out.training = module.training
    if not issubclass(kind, torch.nn.SyncBatchNorm):
        out._converted_from = kind  # what revert_sync_batchnorm makes it again
    if hasattr(module, "qconfig"):
        out.qconfig = module.qconfig
    return out


class BatchNormNd(_BatchNorm):
    """nn.BatchNorm of any input of 2 dimensions or more: what a reverted layer built as the reference SyncBN
    (not converted from a BatchNorm of known dimensionality) becomes."""

    def _check_input_dim(self, input: Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")


def _reverted_class(layer: _BatchNorm) -> type:
    """The BatchNorm class a converted ``layer`` came from (what a lazy one becomes once it has seen its input)."""
    kind = layer.__dict__.get("_converted_from")
    if kind is None:
        return BatchNormNd
    if issubclass(kind, _LazyNormBase) and not layer.has_uninitialized_params():
        return kind.cls_to_become
    return kind


_PLAIN = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d, torch.nn.SyncBatchNorm)
_DERIVED: dict = {}


def _derived(kind: type, cls: type) -> type:
    """``kind`` (a BatchNorm subclass) on top of ``cls``, one class per pair."""
    if (kind, cls) not in _DERIVED:
        _DERIVED[(kind, cls)] = type(f"Sync{kind.__name__}", (kind, cls), {})
    return _DERIVED[(kind, cls)]


class ReferenceImpl(Impl):
    """The reference SyncBN: supports every case on every device the kernels are built for, CUDA graphs included."""

    name = "reference"

    # Its backward is hand-written over kernels with no derivative of their own (no double backward), and its
    # autograd Function is Python, which TorchScript cannot compile. A training step has no host sync (see the
    # module docstring): capturable in a CUDA graph.
    capabilities = Capabilities(convert=True, graph_capture=True, fullgraph=False, double_backward=False,
                                script=False, revert=True)

    def version(self) -> str:
        from harness import __version__

        return __version__

    def check_available(self) -> None:
        try:
            extension.load()
        except KernelBuildError as exc:
            raise ImplUnavailable(f"reference kernels unavailable: {exc}") from exc

    def setup_rank(self, device: str) -> None:
        extension.load()

    def private_ops(self):
        """``torch.ops.syncbn_ref``: its kernels of the five ops of torch's contract (kernels/ops.cpp)."""
        return torch.ops.syncbn_ref

    def build(self, case: Case, process_group, device: str):
        return construct_like_syncbn(SyncBatchNorm, case, process_group, device)

    def convert(self, model, process_group):
        return SyncBatchNorm.convert_sync_batchnorm(model, process_group)

    def revert(self, model):
        return SyncBatchNorm.revert_sync_batchnorm(model)
