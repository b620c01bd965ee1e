"""The models users convert to SyncBN: what the ``conversion`` family feeds to an implementation's converter.

Each model is built by :func:`build` from its name, a width and a seed, the
same in every process: every parameter and floating buffer is drawn from the
seed in float64 and rounded once to the parameter dtype, so the float64 copy
the oracle runs (``build(..., dtype=torch.float64)``) holds exactly the values
the ranks hold. All keep the input's shape (1x1 convolutions, width ``c``).

- ``bn-act``: a BatchNorm subclass that adds an activation after normalizing
  (as timm's ``BatchNormAct2d`` does), between convolutions;
- ``lazy``: a ``LazyBatchNorm2d``, converted before its first input;
- ``frozen``: a BatchNorm frozen inside a trained model (eval mode,
  ``requires_grad=False``, kept so by the model's ``train()``), as detection
  backbones do;
- ``config``: non-default eps, momentum, momentum=None (cumulative average)
  and affine=False;
- ``no-running-stats``: ``track_running_stats=False`` (batch statistics in eval);
- ``nested``: BatchNorms in a ``ModuleList``, a ``ModuleDict`` and nested
  ``Sequential``s, one of them registered at two places and called twice,
  one carrying a ``qconfig``;
- ``no-bias``: a BatchNorm with ``bias=False`` (a weight, no bias) beside one
  with both;
- ``other-norms``: InstanceNorm1d, 2d and 3d, GroupNorm and LayerNorm (all
  affine) beside two BatchNorms, each on its own view of the activations:
  normalizations of one sample at a time, which a converter must leave as
  they are.

The last two are :data:`~harness.catalog.case.MORE_CONVERSION_MODELS`, outside
search's draws.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from harness.catalog.case import CONVERSION_MODELS, MORE_CONVERSION_MODELS

MODELS = CONVERSION_MODELS + MORE_CONVERSION_MODELS
# Normalizations of one sample at a time (no statistics over the batch): a converter leaves them alone.
OTHER_NORMS = (nn.modules.instancenorm._InstanceNorm, nn.GroupNorm, nn.LayerNorm)


class BatchNormAct2d(nn.BatchNorm2d):
    """BatchNorm2d followed by an activation in one module (its behaviour is more than normalization)."""

    def __init__(self, num_features: int, negative_slope: float = 0.1, **kwargs):
        super().__init__(num_features, **kwargs)
        self.act = nn.LeakyReLU(negative_slope)

    def forward(self, x):
        return self.act(super().forward(x))


class FrozenBackbone(nn.Module):
    """A convolution, a frozen BatchNorm that ``train()`` keeps in eval mode, then a trained BatchNorm."""

    def __init__(self, c: int, dtype):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 1, bias=False, dtype=dtype)
        self.frozen = nn.BatchNorm2d(c, dtype=dtype)
        self.head = nn.Sequential(nn.Conv2d(c, c, 1, dtype=dtype), nn.BatchNorm2d(c, dtype=dtype))
        self.frozen.requires_grad_(False)
        self.frozen.eval()

    def train(self, mode: bool = True):
        super().train(mode)
        self.frozen.eval()
        return self

    def forward(self, x):
        return self.head(self.frozen(self.conv(x)))


class Nested(nn.Module):
    """BatchNorms through ModuleList, ModuleDict and Sequential; ``shared`` sits at two places, called twice."""

    def __init__(self, c: int, dtype):
        super().__init__()
        self.shared = nn.BatchNorm2d(c, dtype=dtype)
        self.stages = nn.ModuleList([
            nn.Sequential(nn.Conv2d(c, c, 1, dtype=dtype), nn.BatchNorm2d(c, dtype=dtype)),
            nn.Sequential(OrderedDict(conv=nn.Conv2d(c, c, 1, dtype=dtype), norm=self.shared)),
        ])
        self.heads = nn.ModuleDict({"a": nn.BatchNorm2d(c, eps=1e-3, dtype=dtype),
                                    "b": nn.Sequential(nn.Sequential(nn.BatchNorm2d(c, dtype=dtype)))})
        self.heads["a"].qconfig = torch.ao.quantization.get_default_qat_qconfig("x86")

    def forward(self, x):
        for stage in self.stages:
            x = stage(x)
        x = self.shared(torch.relu(x))
        return self.heads["b"](self.heads["a"](x))


class OtherNorms(nn.Module):
    """InstanceNorm2d, a BatchNorm2d, InstanceNorm1d (over H*W), InstanceNorm3d (depth 1), GroupNorm, LayerNorm
    (over the channels, channels last) and a BatchNorm2d, after a convolution; the input's shape throughout."""

    def __init__(self, c: int, dtype):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 1, dtype=dtype)
        self.in2d = nn.InstanceNorm2d(c, affine=True, dtype=dtype)
        self.bn = nn.BatchNorm2d(c, dtype=dtype)
        self.in1d = nn.InstanceNorm1d(c, affine=True, dtype=dtype)
        self.in3d = nn.InstanceNorm3d(c, affine=True, dtype=dtype)
        self.gn = nn.GroupNorm(2 if c % 2 == 0 else 1, c, dtype=dtype)
        self.ln = nn.LayerNorm(c, dtype=dtype)
        self.head = nn.BatchNorm2d(c, dtype=dtype)

    def forward(self, x):
        x = self.bn(self.in2d(self.conv(x)))
        x = self.in1d(x.flatten(2)).view_as(x)
        x = self.in3d(x.unsqueeze(2)).squeeze(2)
        x = self.ln(self.gn(x).movedim(1, -1)).movedim(-1, 1)
        return self.head(x)


def _seq(c: int, dtype, *norms) -> nn.Sequential:
    layers = []
    for norm in norms:
        layers += [nn.Conv2d(c, c, 1, dtype=dtype), norm]
    return nn.Sequential(*layers)


def _model(name: str, c: int, dtype) -> nn.Module:
    if name == "bn-act":
        return _seq(c, dtype, BatchNormAct2d(c, dtype=dtype), nn.BatchNorm2d(c, dtype=dtype))
    if name == "lazy":
        return _seq(c, dtype, nn.LazyBatchNorm2d(dtype=dtype), nn.BatchNorm2d(c, dtype=dtype))
    if name == "frozen":
        return FrozenBackbone(c, dtype)
    if name == "config":
        return _seq(c, dtype, nn.BatchNorm2d(c, eps=0.05, momentum=0.3, dtype=dtype),
                    nn.BatchNorm2d(c, momentum=None, dtype=dtype), nn.BatchNorm2d(c, affine=False, dtype=dtype))
    if name == "no-running-stats":
        return _seq(c, dtype, nn.BatchNorm2d(c, track_running_stats=False, dtype=dtype),
                    nn.BatchNorm2d(c, dtype=dtype))
    if name == "nested":
        return Nested(c, dtype)
    if name == "no-bias":
        return _seq(c, dtype, nn.BatchNorm2d(c, bias=False, dtype=dtype), nn.BatchNorm2d(c, dtype=dtype))
    if name == "other-norms":
        return OtherNorms(c, dtype)
    raise ValueError(f"unknown conversion model {name!r}: one of {', '.join(MODELS)}")


def build(name: str, c: int, seed: int, dtype=torch.float32, param_dtype=torch.float32) -> nn.Module:
    """The model ``name`` of width ``c`` in ``dtype``, its values drawn from ``seed`` and rounded to ``param_dtype``."""
    model = _model(name, c, dtype)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, t in list(model.named_parameters()) + list(model.named_buffers()):
            if isinstance(t, nn.parameter.UninitializedTensorMixin) or not t.is_floating_point():
                continue
            if pname.endswith("running_var"):
                v = torch.rand(t.shape, generator=gen, dtype=torch.float64) * 0.5 + 0.75
            elif pname.endswith("running_mean") or pname.endswith("bias"):
                v = torch.randn(t.shape, generator=gen, dtype=torch.float64) * 0.3
            elif t.dim() > 1:  # convolution weights: near the identity, so every channel keeps its spread
                v = torch.eye(c, dtype=torch.float64).view(c, c, 1, 1) + 0.3 * torch.randn(
                    t.shape, generator=gen, dtype=torch.float64) / c ** 0.5
            else:  # normalization weights: both signs, never one
                sign = torch.where(torch.rand(t.shape, generator=gen) < 0.3, -1.0, 1.0).double()
                v = sign * (torch.rand(t.shape, generator=gen, dtype=torch.float64) + 0.25)
            t.copy_(v.to(param_dtype))
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.num_batches_tracked is not None:
                if not isinstance(m.num_batches_tracked, nn.parameter.UninitializedTensorMixin):
                    m.num_batches_tracked.fill_(4)
    return model


def unbuildable(name: str):
    """Why this torch cannot build the model ``name`` (``no-bias`` needs BatchNorm's keyword ``bias``), or None."""
    import inspect

    if name == "no-bias" and "bias" not in inspect.signature(nn.BatchNorm2d).parameters:
        return f"torch {torch.__version__}'s BatchNorm2d takes no bias argument (it came with pytorch#176573)"
    return None


def other_norms(model: nn.Module) -> dict[str, nn.Module]:
    """Every normalization of ``model`` that is not a BatchNorm (:data:`OTHER_NORMS`), by every name it has."""
    return {n: m for n, m in model.named_modules(remove_duplicate=False) if isinstance(m, OTHER_NORMS)}


def norm_depth(model: nn.Module) -> int:
    """The layers a network budget counts (:func:`harness.judge.network_budget.network_tolerance`): each
    normalization and the layer before it, and the input."""
    return 2 * (len(batch_norms(model)) + len(other_norms(model))) + 1


def batch_norms(model: nn.Module) -> dict[str, nn.Module]:
    """Every BatchNorm of ``model`` by every name it is registered under (a shared one appears more than once)."""
    return {n: m for n, m in model.named_modules(remove_duplicate=False)
            if isinstance(m, nn.modules.batchnorm._BatchNorm)}
