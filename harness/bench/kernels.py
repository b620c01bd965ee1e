"""``bench kernels`` on CPU: the reference extension's ops, and a whole reference forward+backward.

Each CPU op of the reference extension and a whole reference forward+backward
(one process, no communication), side by side with torch's own CPU
``batch_norm`` forward+backward on the same tensor and with a plain copy of the
same bytes (the memory-bandwidth ceiling). Times are medians
(:func:`harness.bench.timing.median_time`); only the ratios are meant to be
compared across runs. The GPU's counterpart is :mod:`harness.bench.device_kernels`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.bench.timing import median_time

KERNEL_SHAPES = [
    ("N32 C64 56x56 float32 contiguous", (32, 64, 56, 56), torch.float32, torch.contiguous_format),
    ("N32 C64 56x56 float32 channels_last", (32, 64, 56, 56), torch.float32, torch.channels_last),
    ("N32 C64 56x56 float16 contiguous", (32, 64, 56, 56), torch.float16, torch.contiguous_format),
    ("N32 C64 56x56 float16 channels_last", (32, 64, 56, 56), torch.float16, torch.channels_last),
]


@dataclass
class Row:
    name: str
    seconds: float
    bytes_moved: int

    @property
    def gbps(self) -> float:
        return self.bytes_moved / self.seconds / 1e9


def bench_kernels(repeat: int = 7, echo=print) -> list[dict]:
    """Run the kernel benchmark, print a table per shape, return the figures."""
    from harness.kernels import extension

    extension.load()
    ops = torch.ops.syncbn_ref
    echo(f"torch {torch.__version__}, {torch.get_num_threads()} threads; median of {repeat} runs")
    return [_bench_shape(ops, label, shape, dtype, fmt, repeat, echo) for label, shape, dtype, fmt in KERNEL_SHAPES]


def _bench_shape(ops, label, shape, dtype, fmt, repeat, echo) -> dict:
    """One shape of the kernel benchmark: each op, copy, torch and reference fwd+bwd."""
    from harness.impls.reference import SyncBatchNorm

    g = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=g) * 2 + 1).to(dtype).contiguous(memory_format=fmt)
    dy = torch.randn(shape, generator=g).to(dtype).contiguous(memory_format=fmt)
    C = shape[1]
    nbytes = x.numel() * x.element_size()
    w = torch.randn(C)
    b = torch.randn(C)
    dst = torch.empty_like(x)
    mean, invstd = ops.batch_norm_stats(x, 1e-5)
    sum_dy, sum_dy_xmu, _, _ = ops.batch_norm_backward_reduce(dy, x, mean, invstd, w, True, True, True)
    count = torch.tensor([x.numel() // C], dtype=torch.int32)
    rows = [
        Row("copy (bandwidth ceiling)", median_time(lambda: dst.copy_(x), repeat=repeat), 2 * nbytes),
        Row("batch_norm_stats", median_time(lambda: ops.batch_norm_stats(x, 1e-5), repeat=repeat), nbytes),
        Row("welford_stats", median_time(lambda: ops.welford_stats(x), repeat=repeat), nbytes),
        Row("batch_norm_elemt", median_time(lambda: ops.batch_norm_elemt(x, w, b, mean, invstd, 1e-5),
                                            repeat=repeat), 2 * nbytes),
        Row("batch_norm_backward_reduce",
            median_time(lambda: ops.batch_norm_backward_reduce(dy, x, mean, invstd, w, True, True, True),
                        repeat=repeat), 2 * nbytes),
        Row("batch_norm_backward_elemt",
            median_time(lambda: ops.batch_norm_backward_elemt(dy, x, mean, invstd, w, sum_dy, sum_dy_xmu,
                                                              count), repeat=repeat), 3 * nbytes),
    ]

    ref = SyncBatchNorm(C).to(torch.float32)

    def ref_fb():
        xi = x.detach().requires_grad_(True)
        ref(xi).backward(dy)

    torch_w = torch.nn.Parameter(w.to(dtype if dtype == torch.float32 else torch.float32))
    torch_b = torch.nn.Parameter(b.to(torch_w.dtype))
    rm, rv = torch.zeros(C), torch.ones(C)

    def torch_fb():
        xi = x.detach().requires_grad_(True)
        torch.nn.functional.batch_norm(xi, rm, rv, torch_w, torch_b, True, 0.1, 1e-5).backward(dy)

    t_ref = median_time(ref_fb, repeat=repeat)
    t_torch = median_time(torch_fb, repeat=repeat)
    copy_gbps = rows[0].gbps
    echo(f"\n{label}  ({nbytes / 1e6:.1f} MB per tensor)")
    echo(f"  {'op':<34} {'ms':>8} {'GB/s':>8} {'of copy':>8}")
    for r in rows:
        echo(f"  {r.name:<34} {r.seconds * 1e3:8.2f} {r.gbps:8.2f} {r.gbps / copy_gbps:8.2f}")
    echo(f"  {'torch F.batch_norm fwd+bwd':<34} {t_torch * 1e3:8.2f}")
    echo(f"  {'reference SyncBN fwd+bwd':<34} {t_ref * 1e3:8.2f}   ratio to torch: {t_ref / t_torch:.2f}x")
    return {"shape": label, "ops": {r.name: {"ms": r.seconds * 1e3, "gbps": r.gbps} for r in rows},
                "torch_fwd_bwd_ms": t_torch * 1e3, "reference_fwd_bwd_ms": t_ref * 1e3,
                "reference_over_torch": t_ref / t_torch,
            "stats_over_copy_bandwidth": rows[1].gbps / copy_gbps}
