"""The networks of the model scenario: the float64 oracle is the network with batch normalization over the
global batch, and its per-rank parameter copies hold each rank's share of the gradient."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from harness.scenarios import networks


@pytest.mark.parametrize("name", sorted(networks.SPECS))
def test_the_oracle_is_the_network_over_the_global_batch(name):
    layers = networks.spec(name, 3)
    state = networks.init_state(layers, seed=5)
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(n, 3, 4, 4, generator=gen, dtype=torch.float64) for n in (2, 0, 3)]

    # The same network as one module with plain BatchNorm, on all ranks' samples at once.
    net = networks.Net(layers, lambda c: nn.BatchNorm2d(c, eps=1e-5, momentum=0.1)).double()
    with torch.no_grad():
        for key, value in (dict(net.named_parameters()) | dict(net.named_buffers())).items():
            value.copy_(state[key])
    whole = torch.cat(xs)
    y_whole = net(whole)

    names = networks.parameter_names(layers)
    copies = [{n: state[n].clone().requires_grad_(True) for n in names} for _ in xs]
    buffers = {k: v.clone() for k, v in state.items() if k not in names}
    ys = networks.oracle_forward(layers, copies, buffers, xs, train=True, eps=1e-5, momentum=0.1,
                                 param_dtype=torch.float64)
    torch.testing.assert_close(torch.cat(ys), y_whole, rtol=1e-12, atol=1e-12)
    for key, value in dict(net.named_buffers()).items():
        torch.testing.assert_close(buffers[key].double(), value.double(), rtol=1e-12, atol=1e-12)

    # Each rank's copy gets its share; the shares add up to the gradient of the whole.
    g = torch.randn(y_whole.shape, generator=gen, dtype=torch.float64)
    (y_whole * g).sum().backward()
    torch.autograd.backward(ys, list(g.split([x.shape[0] for x in xs])))
    for n, p in net.named_parameters():
        total = sum(c[n].grad for c in copies)
        torch.testing.assert_close(total, p.grad, rtol=1e-10, atol=1e-12)
    if name != "bn-chain":  # the last linear layer's share depends on the rank's samples only
        assert not torch.equal(copies[0]["fc.weight"].grad, copies[2]["fc.weight"].grad)


def test_an_unknown_network_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown network 'vgg': one of bn-chain, bn-first, cnn, resblock"):
        networks.spec("vgg", 3)
