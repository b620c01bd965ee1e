"""Small networks with SyncBN inside, as a module for the ranks and as a float64 function for the oracle.

A network is a spec, a list of layers (:data:`SPECS`): ``conv`` (no bias, as
before a normalization), ``bn`` (the implementation's SyncBN on the ranks,
batch normalization over the global batch in the oracle), ``relu``, ``save``
and ``add`` (a residual connection), ``pool`` (global average pooling and
flatten), ``linear``. :class:`Net` builds it as an ``nn.Module`` from a
normalization factory; :func:`oracle_forward` computes it in float64 over
every rank's batch at once.

The oracle keeps one copy of the parameters per rank (same values), so that
after a backward each copy's gradient is that rank's share of the gradient of
the total loss: exactly what a rank holds before DDP averages the shares.
Batch normalization is the only layer that mixes samples, and it uses the
statistics of every rank's segment together, as SyncBN does.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch
from torch import nn

WIDTH = 8  # channels inside the convolutional networks
CLASSES = 4

SPECS = {
    "bn-chain": lambda cin: [("bn", "bn1", cin), ("bn", "bn2", cin), ("bn", "bn3", cin)],
    # A normalization first, on the data itself (input normalization), then a conv block.
    "bn-first": lambda cin: [("bn", "bn0", cin), ("relu",), ("conv", "conv1", cin, WIDTH, 3), ("bn", "bn1", WIDTH),
                             ("pool",), ("linear", "fc", WIDTH, CLASSES)],
    "cnn": lambda cin: [("conv", "conv1", cin, WIDTH, 3), ("bn", "bn1", WIDTH), ("relu",),
                        ("conv", "conv2", WIDTH, WIDTH, 3), ("bn", "bn2", WIDTH), ("pool",),
                        ("linear", "fc", WIDTH, CLASSES)],
    "resblock": lambda cin: [("conv", "conv1", cin, WIDTH, 1), ("save",), ("bn", "bn1", WIDTH), ("relu",),
                             ("conv", "conv2", WIDTH, WIDTH, 3), ("bn", "bn2", WIDTH), ("add",), ("relu",),
                             ("pool",), ("linear", "fc", WIDTH, CLASSES)],
}


def spec(name: str, cin: int) -> list[tuple]:
    """The layers of network ``name`` for ``cin`` input channels."""
    if name not in SPECS:
        raise ValueError(f"unknown network {name!r}: one of {', '.join(SPECS)}")
    return SPECS[name](cin)


def depth(layers: list[tuple]) -> int:
    """Layers that compute (for tolerances): convolutions, normalizations, linear."""
    return sum(layer[0] in ("conv", "bn", "linear") for layer in layers)


class Net(nn.Module):
    """The network of a spec, its normalizations made by ``norm(num_features)``."""

    def __init__(self, layers: list[tuple], norm: Callable[[int], nn.Module],
                 norm_call: Optional[Callable] = None):
        super().__init__()
        self.layers = layers
        self.norm_call = norm_call  # norm_call(module, x) calls a normalization (e.g. through checkpoint)
        for layer in layers:
            kind = layer[0]
            if kind == "conv":
                _, name, cin, cout, k = layer
                self.add_module(name, nn.Conv2d(cin, cout, k, padding=k // 2, bias=False))
            elif kind == "bn":
                self.add_module(layer[1], norm(layer[2]))
            elif kind == "linear":
                self.add_module(layer[1], nn.Linear(layer[2], layer[3]))

    def forward(self, x):
        saved = None
        for layer in self.layers:
            kind = layer[0]
            if kind == "bn" and self.norm_call is not None:
                x = self.norm_call(getattr(self, layer[1]), x)
            elif kind in ("conv", "bn", "linear"):
                x = getattr(self, layer[1])(x)
            elif kind == "relu":
                x = torch.relu(x)
            elif kind == "save":
                saved = x
            elif kind == "add":
                x = x + saved
            elif kind == "pool":
                x = x.mean(dim=(2, 3))
        return x


def init_state(layers: list[tuple], seed: int) -> dict[str, torch.Tensor]:
    """Parameters and normalization buffers of the network, in float64, from ``seed`` (names as in :class:`Net`)."""
    gen = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for layer in layers:
        kind = layer[0]
        if kind == "conv":
            _, name, cin, cout, k = layer
            state[f"{name}.weight"] = torch.randn(cout, cin, k, k, generator=gen, dtype=torch.float64) \
                / math.sqrt(cin * k * k)
        elif kind == "bn":
            c = layer[2]
            sign = torch.where(torch.rand(c, generator=gen) < 0.3, -1.0, 1.0).double()
            state[f"{layer[1]}.weight"] = sign * (torch.rand(c, generator=gen, dtype=torch.float64) + 0.5)
            state[f"{layer[1]}.bias"] = torch.randn(c, generator=gen, dtype=torch.float64) * 0.5
            state[f"{layer[1]}.running_mean"] = torch.randn(c, generator=gen, dtype=torch.float64) * 0.1
            state[f"{layer[1]}.running_var"] = torch.rand(c, generator=gen, dtype=torch.float64) * 0.5 + 0.75
            state[f"{layer[1]}.num_batches_tracked"] = torch.tensor(0, dtype=torch.long)
        elif kind == "linear":
            _, name, fin, fout = layer
            state[f"{name}.weight"] = torch.randn(fout, fin, generator=gen, dtype=torch.float64) / math.sqrt(fin)
            state[f"{name}.bias"] = torch.randn(fout, generator=gen, dtype=torch.float64) * 0.1
    return state


def parameter_names(layers: list[tuple]) -> list[str]:
    """Every trainable parameter, in :class:`Net`'s order."""
    out = []
    for layer in layers:
        if layer[0] == "conv":
            out.append(f"{layer[1]}.weight")
        elif layer[0] in ("bn", "linear"):
            out += [f"{layer[1]}.weight", f"{layer[1]}.bias"]
    return out


def oracle_forward(layers: list[tuple], params: list[dict], buffers: dict, xs: list[torch.Tensor], *, train: bool,
                   eps: float, momentum: Optional[float], param_dtype: torch.dtype) -> list[torch.Tensor]:
    """The network on every rank's batch at once, in float64 (``params[r]``: rank r's copy of the parameters).

    Normalizations use the statistics of all ranks' segments together in training, the running statistics
    in evaluation; training updates ``buffers`` as SyncBN does (momentum or cumulative average, unbiased
    variance of the global count, rounded to the parameter dtype after each update).
    """
    zs = [x.to(torch.float64) for x in xs]
    saved = None
    for layer in layers:
        kind = layer[0]
        if kind == "conv":
            k = layer[4]
            zs = [torch.nn.functional.conv2d(z, p[f"{layer[1]}.weight"], padding=k // 2) for z, p in zip(zs, params)]
        elif kind == "linear":
            zs = [torch.nn.functional.linear(z, p[f"{layer[1]}.weight"], p[f"{layer[1]}.bias"])
                  for z, p in zip(zs, params)]
        elif kind == "relu":
            zs = [torch.relu(z) for z in zs]
        elif kind == "save":
            saved = zs
        elif kind == "add":
            zs = [z + s for z, s in zip(zs, saved)]
        elif kind == "pool":
            zs = [z.mean(dim=(2, 3)) for z in zs]
        elif kind == "bn":
            zs = _global_bn(layer[1], zs, params, buffers, train=train, eps=eps, momentum=momentum,
                            param_dtype=param_dtype)
    return zs


def _global_bn(name: str, zs, params, buffers, *, train, eps, momentum, param_dtype):
    shape = [1, -1] + [1] * (zs[0].dim() - 2)
    if train:
        flat = torch.cat([z.transpose(0, 1).reshape(z.shape[1], -1) for z in zs], dim=1)
        n = flat.shape[1]
        mean = flat.mean(dim=1)
        var = ((flat - mean[:, None]) ** 2).sum(dim=1) / n
        with torch.no_grad():
            nbt = buffers[f"{name}.num_batches_tracked"] = buffers[f"{name}.num_batches_tracked"] + 1
            f = 1.0 / float(nbt) if momentum is None else momentum
            unbiased = var.detach() * n / (n - 1) if n > 1 else torch.full_like(var, math.inf)
            for key, new in (("running_mean", mean.detach()), ("running_var", unbiased)):
                old = buffers[f"{name}.{key}"]
                buffers[f"{name}.{key}"] = ((1 - f) * old + f * new).to(param_dtype).to(torch.float64)
    else:
        mean = buffers[f"{name}.running_mean"]
        var = buffers[f"{name}.running_var"]
    invstd = 1.0 / torch.sqrt(var + eps)
    return [(z - mean.view(shape)) * (invstd * p[f"{name}.weight"]).view(shape) + p[f"{name}.bias"].view(shape)
            for z, p in zip(zs, params)]
