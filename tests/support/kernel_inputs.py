"""What the CPU and the CUDA kernel tests share: hypothesis strategies for inputs, float64 references, tolerances.

- :func:`inputs`: a tensor of 2 to 5 dims in any dtype and memory format, with
  large offsets and small scales, optionally an empty batch, and channel counts
  drawn from ``channels`` (the CPU tests' set by default; the CUDA tests pass
  :data:`WIDE_CHANNELS`, 1 to 2048). Built on CPU; the CUDA tests move it.
- :func:`long_inputs`: few channels with up to ~128k elements each, so that the
  CUDA reductions split a channel over many blocks and merge the partials.
- :func:`ref_stats` and the helpers: the float64 truth and the tolerance rule
  (a few unit roundoffs of the output dtype, scaled by the values' magnitude).
- :data:`OPCHECK_CASES`: arguments for ``torch.library.opcheck`` of every op.
- :func:`finish_reference`: what ``welford_finish`` computes, in the ATen operations the reference module's
  forward used before the op existed (its CPU kernel matches them bit for bit).
"""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
U = {torch.float16: 2**-11, torch.bfloat16: 2**-8, torch.float32: 2**-24, torch.float64: 2**-53}
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                    derandomize=True)
CPU_CHANNELS = st.sampled_from([1, 3, 7, 16, 64, 67, 130])
# Block, warp and tile edges of the CUDA kernels (32 columns per warp, 128 channels per merge block) and the
# extremes, plus any count in between.
WIDE_CHANNELS = st.one_of(st.sampled_from([1, 2, 31, 32, 33, 127, 128, 129, 255, 257, 1023, 2047, 2048]),
                          st.integers(1, 2048))


@st.composite
def inputs(draw, allow_empty=False, channels=CPU_CHANNELS):
    ndim = draw(st.sampled_from([2, 3, 4, 5]))
    n = draw(st.integers(0 if allow_empty else 1, 5))
    c = draw(channels)
    spatial = tuple(draw(st.integers(1, 6)) for _ in range(ndim - 2))
    if draw(st.booleans()):  # N * spatial == 1
        n, spatial = (1 if not allow_empty or n else 0), (1,) * (ndim - 2)
    dtype = draw(st.sampled_from(DTYPES))
    fmt = torch.contiguous_format
    if ndim == 4 and draw(st.booleans()):
        fmt = torch.channels_last
    if ndim == 5 and draw(st.booleans()):
        fmt = torch.channels_last_3d
    offset = draw(st.sampled_from([0.0, 3.0] + ([1000.0] if dtype in (torch.float32, torch.float64) else [])))
    scale = draw(st.sampled_from([1.0, 0.01]))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    x = offset + scale * torch.randn((n, c, *spatial), generator=g, dtype=torch.float64)
    x = x.to(dtype).contiguous(memory_format=fmt)
    return x, g


@st.composite
def long_inputs(draw):
    """Few channels, many elements each: (N, C, H, W) with N*H*W up to 32*64*64, in either memory format."""
    c = draw(st.sampled_from([1, 3, 67]))
    n = draw(st.integers(1, 32))
    h, w = draw(st.integers(1, 64)), draw(st.integers(1, 64))
    dtype = draw(st.sampled_from(DTYPES))
    fmt = draw(st.sampled_from([torch.contiguous_format, torch.channels_last]))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    x = 3.0 + torch.randn((n, c, h, w), generator=g, dtype=torch.float64)
    return x.to(dtype).contiguous(memory_format=fmt), g


def layout_of(x):
    """The layout a kernel keeps: channels-last when the tensor is laid out so (and not also NCHW)."""
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
        return torch.channels_last
    if x.dim() == 5 and x.is_contiguous(memory_format=torch.channels_last_3d) and not x.is_contiguous():
        return torch.channels_last_3d
    return torch.contiguous_format


def reduce_dims(x):
    """Every dim but the channel dim."""
    return [0] + list(range(2, x.dim()))


def per_channel(v, x):
    """A [C] vector shaped to broadcast against ``x``."""
    return v.view(1, -1, *([1] * (x.dim() - 2)))


def acc_dtype(dtype):
    """The dtype of statistics for input of ``dtype``."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def assert_close_u(got, want, dtype, scale=1.0, units=4):
    """``got`` within ``units`` unit roundoffs of ``dtype`` of ``want``: relative, and absolute at ``scale``."""
    u = U[dtype]
    torch.testing.assert_close(got.double().cpu(), want.double().cpu(), rtol=units * u, atol=units * u * scale)


def ref_stats(x, eps):
    """float64 mean and 1/sqrt(biased var + eps) per channel."""
    x64 = x.double()
    mean = x64.mean(reduce_dims(x))
    var = x64.var(reduce_dims(x), unbiased=False)
    return mean, 1.0 / torch.sqrt(var + eps)


OPCHECK_CASES = [
    ("batch_norm_stats", lambda x, k: (x, 1e-5)),
    ("batch_norm_elemt", lambda x, k: (x, torch.randn(x.shape[1]), torch.randn(x.shape[1]),
                                       *k.batch_norm_stats(x, 1e-5), 1e-5)),
    ("batch_norm_backward_reduce", lambda x, k: (torch.randn_like(x), x, *k.batch_norm_stats(x, 1e-5),
                                                 torch.randn(x.shape[1]), True, True, True)),
    ("batch_norm_backward_reduce", lambda x, k: (torch.randn_like(x), x, *k.batch_norm_stats(x, 1e-5),
                                                 None, True, False, False)),
    ("batch_norm_backward_elemt", lambda x, k: (torch.randn_like(x), x, *k.batch_norm_stats(x, 1e-5),
                                                torch.randn(x.shape[1]), torch.randn(x.shape[1]),
                                                torch.randn(x.shape[1]), torch.tensor([x.numel() // x.shape[1]],
                                                                                      dtype=torch.int32))),
    ("batch_norm_gather_stats_with_counts", lambda x, k: (
        x, torch.stack([k.batch_norm_stats(x, 1e-5)[0]] * 2), torch.stack([k.batch_norm_stats(x, 1e-5)[1]] * 2),
        torch.zeros(x.shape[1]), torch.ones(x.shape[1]), 0.1, 1e-5, torch.tensor([3.0, 4.0]))),
    ("welford_stats", lambda x, k: (x,)),
    ("welford_merge", lambda x, k: (torch.stack([k.welford_stats(x), k.welford_stats(x * 2)]),)),
    ("welford_finish", lambda x, k: (k.welford_stats(x), torch.zeros(x.shape[1]), torch.ones(x.shape[1]), 0.1, 1e-5)),
]


def running_buffers(c, g, dtype):
    """A layer's running mean and variance in ``dtype`` (variance in [0.5, 1.5)), or (None, None) for no dtype."""
    if dtype is None:
        return None, None
    return (torch.randn(c, generator=g, dtype=torch.float64).to(dtype),
            (torch.rand(c, generator=g, dtype=torch.float64) + 0.5).to(dtype))


def finish_reference(merged, running_mean, running_var, momentum, eps):
    """``welford_finish`` in plain torch (float64): (mean, invstd) and the running statistics updated in place."""
    c = (merged.numel() - 1) // 2
    n = float(merged[0])
    mean, m2 = merged[1:1 + c], merged[1 + c:]
    if not n >= 2:
        nan = float("nan")
        return (torch.zeros_like(mean), torch.ones_like(m2)) if n < 1 else (torch.full_like(mean, nan),
                                                                             torch.full_like(m2, nan))
    invstd = torch.rsqrt(m2 / n + eps)
    if running_mean is not None:
        running_mean.copy_((1 - momentum) * running_mean.double() + momentum * mean)
    if running_var is not None:
        running_var.copy_((1 - momentum) * running_var.double() + momentum * (m2 / (n - 1)))
    return mean.clone(), invstd
