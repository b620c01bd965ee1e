"""The reference SyncBatchNorm's training step in a CUDA graph (one process, no process group).

Its forward and backward read nothing on the host on a rank with 2 or more
values per channel (kernels/cuda/syncbn_cuda.cu, harness/impls/reference.py),
so a step captures in ``torch.cuda.CUDAGraph``; replayed on new inputs it must
give what the same module gives eagerly (the same kernels: the same bits) and
the float64 truth within a few roundings. Every test here is marked ``cuda``.
"""

from __future__ import annotations

import copy

import pytest
import torch
from kernel_inputs import assert_close_u

pytestmark = pytest.mark.cuda
EPS = 1e-5


def _module(c, dtype):
    from harness.impls.reference import SyncBatchNorm

    g = torch.Generator().manual_seed(5)
    m = SyncBatchNorm(c).cuda()
    with torch.no_grad():
        m.weight.copy_(torch.randn(c, generator=g))
        m.bias.copy_(torch.randn(c, generator=g))
        m.running_mean.copy_(torch.randn(c, generator=g))
        m.running_var.copy_(torch.rand(c, generator=g) + 0.5)
    return m


def _inputs(shape, dtype, fmt, seed):
    g = torch.Generator().manual_seed(seed)
    x = (3.0 + 2.0 * torch.randn(shape, generator=g, dtype=torch.float64)).to(dtype)
    dy = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    return x.contiguous(memory_format=fmt).cuda(), dy.contiguous(memory_format=fmt).cuda()


def _capture(module, x_static, dy_static):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    initial = {k: v.clone() for k, v in module.state_dict().items()}
    with torch.cuda.stream(side):  # warm-up outside the capture
        for _ in range(2):
            module(x_static).backward(dy_static)
            module.zero_grad(set_to_none=True)
            x_static.grad = None
    torch.cuda.current_stream().wait_stream(side)
    with torch.no_grad():
        for k, v in module.state_dict().items():
            v.copy_(initial[k])
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = module(x_static)
        y.backward(dy_static)
    return graph, y


@pytest.mark.parametrize("shape,dtype,fmt", [
    ((4, 8, 5, 6), torch.float32, torch.contiguous_format),
    ((4, 16, 5, 6), torch.float16, torch.channels_last),
    ((6, 32), torch.bfloat16, torch.contiguous_format),
    ((3, 8, 64, 64), torch.float32, torch.channels_last),  # channels split over blocks: the last-block merge
], ids=["float32-nchw", "float16-nhwc", "bfloat16-2d", "float32-nhwc-split"])
def test_reference_training_step_captured_in_a_cuda_graph(shape, dtype, fmt):
    c = shape[1]
    graphed = _module(c, dtype)
    eager = copy.deepcopy(graphed)
    x0, dy0 = _inputs(shape, dtype, fmt, 0)
    x_static, dy_static = x0.clone().requires_grad_(True), dy0.clone()
    graph, y_static = _capture(graphed, x_static, dy_static)
    for step in range(1, 4):
        x, dy = _inputs(shape, dtype, fmt, step)
        with torch.no_grad():
            x_static.copy_(x)
            dy_static.copy_(dy)
        graph.replay()
        torch.cuda.synchronize()
        xe = x.clone().requires_grad_(True)
        eager.zero_grad(set_to_none=True)
        ye = eager(xe)
        ye.backward(dy)
        # The same kernels on the same data: the same bits.
        assert torch.equal(y_static, ye) and torch.equal(x_static.grad, xe.grad), step
        assert torch.equal(graphed.weight.grad, eager.weight.grad) and torch.equal(graphed.bias.grad, eager.bias.grad)
        assert torch.equal(graphed.running_mean, eager.running_mean)
        assert torch.equal(graphed.running_var, eager.running_var)
        assert int(graphed.num_batches_tracked) == int(eager.num_batches_tracked) == step
        # And the float64 truth.
        x64, dy64 = x.double(), dy.double()
        dims = [0] + list(range(2, x.dim()))
        view = (1, c) + (1,) * (x.dim() - 2)
        mean, var = x64.mean(dims), x64.var(dims, unbiased=False)
        xhat = (x64 - mean.view(view)) / torch.sqrt(var.view(view) + EPS)
        w64, b64 = eager.weight.double().detach(), eager.bias.double().detach()
        want = xhat * w64.view(view) + b64.view(view)
        assert_close_u(y_static, want.to(dtype), dtype, scale=float(want.abs().max()) + 1)
        g_xhat = dy64 * w64.view(view)
        want_dx = (g_xhat - g_xhat.mean(dims, keepdim=True)
                   - xhat * (g_xhat * xhat).mean(dims, keepdim=True)) / torch.sqrt(var.view(view) + EPS)
        assert_close_u(x_static.grad, want_dx.to(dtype), dtype, scale=float(want_dx.abs().max()) + 1, units=8)
        assert_close_u(graphed.bias.grad, dy64.sum(dims), torch.float32, scale=float(dy64.abs().sum(dims).max()))


def test_an_all_empty_step_captures_and_keeps_the_running_statistics():
    """A rank with no values (here the whole group): no host read under capture; the step leaves the running
    statistics as they were and gives an empty output, replay after replay."""
    graphed = _module(8, torch.float32)
    before = (graphed.running_mean.clone(), graphed.running_var.clone())
    x_static = torch.empty(0, 8, 4, 4, device="cuda", requires_grad=True)
    dy_static = torch.empty(0, 8, 4, 4, device="cuda")
    graph, y = _capture(graphed, x_static, dy_static)
    for _ in range(2):
        graph.replay()
    torch.cuda.synchronize()
    assert y.shape == (0, 8, 4, 4)
    assert torch.equal(graphed.running_mean, before[0]) and torch.equal(graphed.running_var, before[1])
    assert bool(torch.isfinite(graphed.bias.grad).all())


def test_one_value_in_all_under_capture_gives_nan_not_a_host_read():
    """Eagerly the module refuses 1 value per channel (it reads the count: a host sync). Under capture it cannot
    read it: the output is NaN and the running statistics are kept."""
    graphed = _module(4, torch.float32)
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        graphed(torch.randn(1, 4, device="cuda"))
    x_static = torch.randn(1, 4, device="cuda")
    graph, y = _capture_forward_only(graphed, x_static)
    torch.cuda.synchronize()
    before = graphed.running_mean.clone()
    graph.replay()
    torch.cuda.synchronize()
    assert bool(y.isnan().all()) and torch.equal(graphed.running_mean, before)


def _capture_forward_only(module, x_static):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        module(torch.randn(2, *x_static.shape[1:], device="cuda"))  # warm-up with 2 values (no host read needed)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        y = module(x_static)
    return graph, y


def test_a_training_step_syncs_nothing():
    """The module's eager forward+backward (2 or more values per channel) under torch's sync debug mode."""
    m = _module(8, torch.float16)
    x = torch.randn(4, 8, 6, 6, device="cuda", dtype=torch.float16, requires_grad=True)
    dy = torch.randn(4, 8, 6, 6, device="cuda", dtype=torch.float16)
    m(x).backward(dy)  # first call: kernels loaded, allocator warm
    x.grad = None
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")  # a host sync in the step raises RuntimeError
    try:
        assert torch.cuda.get_sync_debug_mode() == 2
        m(x).backward(dy)
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    assert x.grad is not None and x.grad.shape == x.shape and bool(torch.isfinite(x.grad).all())
