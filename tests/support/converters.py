"""Converters with the defects real ones shipped, each on top of the reference SyncBN (plugins for the tests).

Each class is a plugin (``converters:<Name>``): the reference SyncBatchNorm, whose
``convert_sync_batchnorm`` is written the way a real converter went wrong. The
conversion family must catch every one; :data:`CATCHERS` says where and how.
"""

from __future__ import annotations

import torch
from torch.nn.modules.batchnorm import _BatchNorm, _NormBase

from harness.impls.reference import SyncBatchNorm


def _textbook(cls, module, process_group, *, keep_training=True, share=True, qconfig=True, keep_config=True,
              keep_requires_grad=True, keep_no_bias=True, kinds=(_BatchNorm,), memo=None):
    """The converter most code bases have: replace each _BatchNorm met in the recursion with a new layer."""
    out = module
    if isinstance(module, kinds):
        if keep_config:
            out = cls(module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats,
                      process_group)
        else:
            out = cls(module.num_features, process_group=process_group)
        if module.affine:
            with torch.no_grad():
                if not keep_no_bias:  # written before bias=False: a bias is copied where there is one
                    out.weight = module.weight
                    if module.bias is not None:
                        out.bias = module.bias
                elif share:
                    out.weight, out.bias = module.weight, module.bias
                else:
                    out.weight = torch.nn.Parameter(module.weight.detach().clone())
                    out.bias = torch.nn.Parameter(module.bias.detach().clone())
            if not keep_requires_grad:
                out.weight.requires_grad_(True)
                out.bias.requires_grad_(True)
        if module.track_running_stats:
            out.running_mean, out.running_var = module.running_mean, module.running_var
            out.num_batches_tracked = module.num_batches_tracked
        if keep_training:
            out.training = module.training
        if qconfig and hasattr(module, "qconfig"):
            out.qconfig = module.qconfig
    memo = {} if memo is None else memo
    for name, child in module.named_children():
        if share and id(child) in memo:
            out.add_module(name, memo[id(child)])
            continue
        converted = _textbook(cls, child, process_group, keep_training=keep_training, share=share, qconfig=qconfig,
                              keep_config=keep_config, keep_requires_grad=keep_requires_grad,
                              keep_no_bias=keep_no_bias, kinds=kinds, memo=memo)
        memo[id(child)] = converted
        out.add_module(name, converted)
    return out


class DropsTraining(SyncBatchNorm):
    """Every converted layer is left in training mode, whatever it was (pytorch PR #111998, mmengine#1624)."""

    @classmethod
    def convert_sync_batchnorm(cls, module, process_group=None):
        return _textbook(cls, module, process_group, keep_training=False)


class ReplacesSubclasses(SyncBatchNorm):
    """Any _BatchNorm, subclass or not, becomes a plain SyncBN: a fused activation is lost (pytorch#187298)."""

    @classmethod
    def convert_sync_batchnorm(cls, module, process_group=None):
        return _textbook(cls, module, process_group)


class ResetsRequiresGrad(SyncBatchNorm):
    """Frozen affine parameters become trainable again after conversion (pytorch#22569)."""

    @classmethod
    def convert_sync_batchnorm(cls, module, process_group=None):
        return _textbook(cls, module, process_group, keep_requires_grad=False)


class LosesQconfig(SyncBatchNorm):
    """The converted layer has no qconfig (pytorch#45317)."""

    @classmethod
    def convert_sync_batchnorm(cls, module, process_group=None):
        return _textbook(cls, module, process_group, qconfig=False)


class CopiesParameters(SyncBatchNorm):
    """Parameters are copied into the new layers, and a module registered twice becomes two modules."""

    @classmethod
    def convert_sync_batchnorm(cls, module, process_group=None):
        return _textbook(cls, module, process_group, share=False)


class DefaultConfig(SyncBatchNorm):
    """New layers are built with the default eps and momentum (the module's own are not carried over)."""

    @classmethod
    def convert_sync_batchnorm(cls, module, process_group=None):
        return _textbook(cls, module, process_group, keep_config=False)


class DropsBiasFalse(SyncBatchNorm):
    """A converter written before BatchNorm's bias=False (pytorch#176573): the new layer keeps the bias it was built
    with wherever the BatchNorm has none."""

    @classmethod
    def convert_sync_batchnorm(cls, module, process_group=None):
        return _textbook(cls, module, process_group, keep_no_bias=False)


class ConvertsInstanceNorm(SyncBatchNorm):
    """Every _NormBase becomes a SyncBN, InstanceNorm included (pytorch#29187, apex#437: the check that matched
    InstanceNorm while it derived from _BatchNorm)."""

    @classmethod
    def convert_sync_batchnorm(cls, module, process_group=None):
        return _textbook(cls, module, process_group, kinds=(_NormBase,))


def _revert(cls, module, *, keep_training=True, keep_requires_grad=True, keep_no_bias=True):
    """The revert most code bases have (pytorch#41081's recipe): each converted layer becomes a new BatchNorm2d."""
    out = module
    if isinstance(module, cls):
        out = torch.nn.BatchNorm2d(module.num_features, module.eps, module.momentum, module.affine,
                                   module.track_running_stats)
        if module.affine:
            if keep_requires_grad:
                out.weight = module.weight
            else:  # new parameters with the values: trainable whatever they were
                out.weight = torch.nn.Parameter(module.weight.detach().clone())
            if keep_no_bias or module.bias is not None:
                out.bias = module.bias if keep_requires_grad or module.bias is None else torch.nn.Parameter(
                    module.bias.detach().clone())
        out.running_mean, out.running_var = module.running_mean, module.running_var
        out.num_batches_tracked = module.num_batches_tracked
        if keep_training:
            out.training = module.training
    for name, child in module.named_children():
        out.add_module(name, _revert(cls, child, keep_training=keep_training, keep_requires_grad=keep_requires_grad,
                                     keep_no_bias=keep_no_bias))
    return out


class RevertDropsTraining(SyncBatchNorm):
    """The revert leaves every layer in training mode (mmocr PR #453; Lightning's TorchSyncBatchNorm.revert)."""

    @classmethod
    def revert_sync_batchnorm(cls, module):
        return _revert(cls, module, keep_training=False)


class RevertResetsRequiresGrad(SyncBatchNorm):
    """The revert makes new parameters from the values: frozen ones become trainable (pytorch#22569's kind)."""

    @classmethod
    def revert_sync_batchnorm(cls, module):
        return _revert(cls, module, keep_requires_grad=False)


class RevertDropsBiasFalse(SyncBatchNorm):
    """The revert keeps the bias BatchNorm2d is built with where the layer had none (bias=False lost)."""

    @classmethod
    def revert_sync_batchnorm(cls, module):
        return _revert(cls, module, keep_no_bias=False)


# Defect -> (a default-selection case that must catch it, what the message must say)
CATCHERS = {
    DropsTraining: ("conversion/frozen/float64/uneven-3-5/ws2", "frozen: training=True after conversion, was False"),
    ReplacesSubclasses: ("conversion/bn-act/float32/uneven-3-5/ws2", "whose forward does more than normalize"),
    ResetsRequiresGrad: ("conversion/frozen/float64/uneven-3-5/ws2", "frozen.weight: requires_grad=True"),
    LosesQconfig: ("conversion/nested/float32/uneven-3-5/ws2", "heads.a: qconfig lost"),
    CopiesParameters: ("conversion/nested/float32/uneven-3-5/ws2", "was copied, not shared"),
    DefaultConfig: ("conversion/config/float32/uneven-3-5/ws2", "step0.train.output"),
}


class ExtraStateBuffer(SyncBatchNorm):
    """Each converted layer records the world size in a persistent buffer: checkpoints no longer load into the
    plain model (strict load_state_dict: an unexpected key), so there is no way back to BatchNorm."""

    @classmethod
    def convert_sync_batchnorm(cls, module, process_group=None):
        import torch.distributed as dist

        out = SyncBatchNorm.convert_sync_batchnorm.__func__(cls, module, process_group)
        for m in out.modules():
            if isinstance(m, cls):
                m.register_buffer("world_size", torch.tensor(dist.get_world_size(process_group)))
        return out


CATCHERS[ExtraStateBuffer] = ("conversion/checkpoint-revert/config/float32/ws2", "does not load into the plain model")
CATCHERS.update({
    DropsBiasFalse: ("conversion/no-bias/float32/uneven-3-5/ws2", "1.bias exists after conversion and was None before "
                                                                  "(bias=False not carried over)"),
    ConvertsInstanceNorm: ("conversion/other-norms/float32/uneven-2-1-4/ws3",
                           "in2d was InstanceNorm2d, which normalizes each sample alone; it is now "
                           "ConvertsInstanceNorm"),
    RevertDropsTraining: ("conversion/revert/frozen/float32/uneven-3-5/ws2",
                          "frozen: training=True after revert, was False"),
    RevertResetsRequiresGrad: ("conversion/revert/frozen/float32/uneven-3-5/ws2",
                               "frozen.weight: requires_grad=True after revert, was False"),
    RevertDropsBiasFalse: ("conversion/revert/no-bias/float32/uneven-3-5/ws2", "1: bias=True after revert, was False"),
})
