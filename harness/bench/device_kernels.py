"""``bench kernels --device cuda``: the reference's CUDA kernels against torch's native CUDA kernels of the same ops.

Figures per shape, every one a ratio against a baseline measured in the same run:

- each of the reference's four per-element ops (``syncbn_ref::batch_norm_stats``,
  ``batch_norm_elemt``, ``batch_norm_backward_reduce``, ``batch_norm_backward_elemt``)
  against torch's own kernel of the same ATen op (``torch.batch_norm_stats``, ...,
  the kernels ``torch.nn.SyncBatchNorm`` runs), on the same tensors: reference
  time / torch time;
- ``welford_stats``, the statistics pass the reference SyncBN runs, against
  ``torch.batch_norm_stats``, and its bandwidth (bytes read / time) as a fraction
  of a device-to-device copy of the same bytes (a copy reads and writes them:
  2 x bytes / time), the GPU's memory bandwidth as this run measures it; also of
  the theoretical peak where torch reports the memory clock and bus width;
- a whole forward+backward: the reference SyncBatchNorm (one process, no process
  group) against ``F.batch_norm`` (cuDNN or torch's native kernels) on the same tensor.

Timing: CUDA events around each call, median over ``repeat`` after warm-up calls.
The arithmetic from median times to figures is :func:`derive` (pure). The code
is device-generic: the command runs it on ``cuda``; the tests run it on CPU in a
process where torch's five ops have the reference CPU kernels (the torch CPU
emulation), which exercises every line but gives ratios near 1 by construction.
"""

from __future__ import annotations

from typing import Optional

import torch

from harness.bench.timing import cuda_median_time

CUDA_SHAPES = [
    ("N64 C256 56x56 float32 contiguous", (64, 256, 56, 56), torch.float32, torch.contiguous_format),
    ("N64 C256 56x56 float32 channels_last", (64, 256, 56, 56), torch.float32, torch.channels_last),
    ("N64 C256 56x56 float16 contiguous", (64, 256, 56, 56), torch.float16, torch.contiguous_format),
    ("N64 C256 56x56 float16 channels_last", (64, 256, 56, 56), torch.float16, torch.channels_last),
]
OPS = ("batch_norm_stats", "batch_norm_elemt", "batch_norm_backward_reduce", "batch_norm_backward_elemt")
EPS = 1e-5


def gb_per_s(nbytes: float, seconds: float) -> float:
    """Throughput in GB/s (10^9 bytes per second)."""
    return nbytes / seconds / 1e9


def peak_gb_per_s(memory_clock_khz: Optional[float], bus_width_bits: Optional[float]) -> Optional[float]:
    """Theoretical memory bandwidth of a GPU (double data rate) from its clock and bus width; None if unknown."""
    if not memory_clock_khz or not bus_width_bits:
        return None
    return 2 * memory_clock_khz * 1e3 * bus_width_bits / 8 / 1e9


def device_peak_gb_per_s(device: str) -> Optional[float]:
    """The current GPU's theoretical bandwidth, where torch reports clock and bus width (else None)."""
    if device != "cuda":
        return None
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return peak_gb_per_s(getattr(props, "memory_clock_rate", None), getattr(props, "memory_bus_width", None))


def derive(times: dict[str, float], nbytes: int, peak: Optional[float] = None) -> dict:
    """The figures of one shape from its median times in seconds (pure).

    ``times`` has ``copy``, ``reference <op>`` and ``torch <op>`` for each op of
    :data:`OPS`, ``reference welford_stats``, ``reference fwd+bwd`` and
    ``torch fwd+bwd``; ``nbytes`` is the size of one input tensor.
    """
    copy = gb_per_s(2 * nbytes, times["copy"])
    stats = gb_per_s(nbytes, times["reference welford_stats"])
    ops = {op: {"reference_ms": times[f"reference {op}"] * 1e3, "torch_ms": times[f"torch {op}"] * 1e3,
                "reference_over_torch": times[f"reference {op}"] / times[f"torch {op}"]} for op in OPS}
    ops["welford_stats"] = {"reference_ms": times["reference welford_stats"] * 1e3,
                            "torch_ms": times["torch batch_norm_stats"] * 1e3,
                            "reference_over_torch": times["reference welford_stats"] / times["torch batch_norm_stats"]}
    return {
        "ops": ops,
        "copy_gbps": copy,
        "stats_gbps": stats,
        "stats_over_copy_bandwidth": stats / copy,
        "peak_gbps": peak,
        "stats_over_peak_bandwidth": stats / peak if peak else None,
        "reference_fwd_bwd_ms": times["reference fwd+bwd"] * 1e3,
        "torch_fwd_bwd_ms": times["torch fwd+bwd"] * 1e3,
        "reference_over_torch": times["reference fwd+bwd"] / times["torch fwd+bwd"],
    }


def bench_device_kernels(device: str = "cuda", repeat: int = 20, echo=print, shapes=None, timer=None) -> list[dict]:
    """Run the benchmark on ``device`` (see the module docstring), print a table per shape, return the figures."""
    from harness.kernels import extension

    extension.load()
    if timer is None:
        if device == "cuda":
            timer = cuda_median_time
        else:
            from harness.bench.timing import median_time as timer
    peak = device_peak_gb_per_s(device)
    where = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    echo(f"torch {torch.__version__} (CUDA {torch.version.cuda}) on {where}; median of {repeat} runs")
    out = []
    for label, shape, dtype, fmt in shapes or CUDA_SHAPES:
        times, nbytes = _time_shape(torch.ops.syncbn_ref, device, shape, dtype, fmt, repeat, timer)
        figures = {"shape": label, "device": where, **derive(times, nbytes, peak)}
        _print(figures, nbytes, echo)
        out.append(figures)
    return out


def _time_shape(ops, device, shape, dtype, fmt, repeat, timer) -> tuple[dict[str, float], int]:
    """Median times of every figure's call for one shape, and the size of one input tensor."""
    from harness.impls.reference import SyncBatchNorm

    g = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=g) * 2 + 1).to(device=device, dtype=dtype).contiguous(memory_format=fmt)
    dy = torch.randn(shape, generator=g).to(device=device, dtype=dtype).contiguous(memory_format=fmt)
    C = shape[1]
    nbytes = x.numel() * x.element_size()
    w, b = torch.randn(C, device=device), torch.randn(C, device=device)
    dst = torch.empty_like(x)
    mean, invstd = torch.batch_norm_stats(x, EPS)
    sum_dy, sum_dy_xmu, _, _ = torch.batch_norm_backward_reduce(dy, x, mean, invstd, w, True, True, True)
    count = torch.tensor([x.numel() // C], dtype=torch.int32, device=device)
    args = {
        "batch_norm_stats": (x, EPS),
        "batch_norm_elemt": (x, w, b, mean, invstd, EPS),
        "batch_norm_backward_reduce": (dy, x, mean, invstd, w, True, True, True),
        "batch_norm_backward_elemt": (dy, x, mean, invstd, w, sum_dy, sum_dy_xmu, count),
    }
    times = {"copy": timer(lambda: dst.copy_(x), repeat=repeat)}
    for op in OPS:
        times[f"reference {op}"] = timer(lambda op=op: getattr(ops, op)(*args[op]), repeat=repeat)
        times[f"torch {op}"] = timer(lambda op=op: getattr(torch, op)(*args[op]), repeat=repeat)
    times["reference welford_stats"] = timer(lambda: ops.welford_stats(x), repeat=repeat)

    ref = SyncBatchNorm(C).to(device)
    torch_w, torch_b = torch.nn.Parameter(w.clone()), torch.nn.Parameter(b.clone())
    rm, rv = torch.zeros(C, device=device), torch.ones(C, device=device)

    def ref_fb():
        ref(x.detach().requires_grad_(True)).backward(dy)

    def torch_fb():
        xi = x.detach().requires_grad_(True)
        torch.nn.functional.batch_norm(xi, rm, rv, torch_w, torch_b, True, 0.1, EPS).backward(dy)

    times["reference fwd+bwd"] = timer(ref_fb, repeat=repeat)
    times["torch fwd+bwd"] = timer(torch_fb, repeat=repeat)
    return times, nbytes


def _print(f: dict, nbytes: int, echo) -> None:
    echo(f"\n{f['shape']}  ({nbytes / 1e6:.1f} MB per tensor)")
    echo(f"  {'op':<30} {'reference ms':>12} {'torch ms':>10} {'ref/torch':>10}")
    for op, row in f["ops"].items():
        name = op if op != "welford_stats" else "welford_stats (vs torch stats)"
        echo(f"  {name:<30} {row['reference_ms']:12.3f} {row['torch_ms']:10.3f} {row['reference_over_torch']:9.2f}x")
    peak = (f", {f['stats_over_peak_bandwidth']:.2f} of the {f['peak_gbps']:.0f} GB/s peak"
            if f["peak_gbps"] else "")
    echo(f"  statistics pass (welford_stats): {f['stats_gbps']:.0f} GB/s = {f['stats_over_copy_bandwidth']:.2f} of "
         f"copy ({f['copy_gbps']:.0f} GB/s){peak}")
    echo(f"  fwd+bwd: reference {f['reference_fwd_bwd_ms']:.3f} ms, torch F.batch_norm {f['torch_fwd_bwd_ms']:.3f} ms: "
         f"{f['reference_over_torch']:.2f}x")
