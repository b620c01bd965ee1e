"""``bench kernels --device cuda``: the reference's CUDA kernels against torch's native CUDA kernels of the same ops.

Shapes (:func:`cuda_shapes`): what SyncBN users run per GPU. The batch-norm
layers of ResNet-50 (C64 112x112, C256 56x56, C512 28x28, C1024 14x14, C2048
7x7) at N16 and N2, contiguous and channels_last, and 2-D [N, C] input, each
in float32, float16 and bfloat16. Figures per shape, every one a ratio against
a baseline measured in the same run on the same tensors:

- each of the reference's ATen-contract ops (``syncbn_ref::batch_norm_stats``,
  ``batch_norm_elemt``, ``batch_norm_backward_reduce``,
  ``batch_norm_backward_elemt``, and ``batch_norm_gather_stats_with_counts`` over
  one row) against torch's own kernel of the same ATen op: reference time /
  torch time;
- ``welford_stats``, the statistics pass the reference SyncBN runs, against
  ``torch.batch_norm_stats``, and its bandwidth (bytes read / time) as a fraction
  of a device-to-device copy of the same bytes (a copy reads and writes them:
  2 x bytes / time), the GPU's memory bandwidth as this run measures it; also of
  the theoretical peak where torch reports the memory clock and bus width;
- one training step's forward+backward: the reference's op sequence (its
  autograd Function, no process group) over torch SyncBatchNorm's (the five ops
  its Function runs, without the collectives): ``sequence_over_torch``; and the
  reference SyncBatchNorm module over ``F.batch_norm`` (cuDNN):
  ``reference_over_torch``;
- ``meets_goal``: every op within 1.2x of torch's and the statistics pass at 60%
  or more of copy bandwidth (:data:`GOAL_RATIO`, :data:`GOAL_BANDWIDTH`).

Timing on CUDA: ``calls`` consecutive calls captured in one CUDA graph and
replayed ``repeat`` times between CUDA events, the median replay divided by
``calls``: device time, without Python's launch overhead (which would decide
small shapes otherwise). Where a tensor is smaller than twice the L2 cache,
the calls rotate over enough copies of the inputs that each call reads memory,
not L2; past 256 copies the shape is reported ``l2_resident``. A figure whose
capture fails is timed eagerly (``timing``). The arithmetic from median times
to figures is :func:`derive` (pure). The code is device-generic: the tests run
it on CPU in a process where torch's five ops have the reference CPU kernels
(the torch CPU emulation), which exercises every line but the graph timer and
gives ratios near 1 by construction.
"""

from __future__ import annotations

import math
import statistics
from typing import Callable, Optional

import torch

from harness.bench.timing import cuda_median_time

RESNET_LAYERS = [(64, 112), (256, 56), (512, 28), (1024, 14), (2048, 7)]  # (C, H = W) of ResNet-50's BN layers
FLAT = [(16, 2048), (2, 2048), (16, 256)]  # 2-D [N, C]
DTYPES = [("float32", torch.float32), ("float16", torch.float16), ("bfloat16", torch.bfloat16)]
LAYOUTS = [("contiguous", torch.contiguous_format), ("channels_last", torch.channels_last)]
OPS = ("batch_norm_stats", "batch_norm_elemt", "batch_norm_backward_reduce", "batch_norm_backward_elemt")
GATHER = "batch_norm_gather_stats_with_counts"
GOAL_RATIO, GOAL_BANDWIDTH = 1.2, 0.6
EPS = 1e-5
MAX_COPIES = 256


def cuda_shapes() -> list[tuple]:
    """(label, shape, dtype, memory format) of every shape the CUDA benchmark measures."""
    out = []
    for dname, dtype in DTYPES:
        for n in (16, 2):
            for c, hw in RESNET_LAYERS:
                for lname, fmt in LAYOUTS:
                    out.append((f"N{n} C{c} {hw}x{hw} {dname} {lname}", (n, c, hw, hw), dtype, fmt))
        for n, c in FLAT:
            out.append((f"N{n} C{c} {dname} 2d", (n, c), dtype, torch.contiguous_format))
    return out


CUDA_SHAPES = cuda_shapes()


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
    ``torch fwd+bwd``; where present, also the gather op's pair and
    ``reference sequence`` / ``torch sequence``. ``nbytes`` is the size of one
    input tensor.
    """
    copy = gb_per_s(2 * nbytes, times["copy"])
    stats = gb_per_s(nbytes, times["reference welford_stats"])
    names = OPS + ((GATHER,) if f"reference {GATHER}" in times else ())
    ops = {op: {"reference_ms": times[f"reference {op}"] * 1e3, "torch_ms": times[f"torch {op}"] * 1e3,
                "reference_over_torch": times[f"reference {op}"] / times[f"torch {op}"]} for op in names}
    ops["welford_stats"] = {"reference_ms": times["reference welford_stats"] * 1e3,
                            "torch_ms": times["torch batch_norm_stats"] * 1e3,
                            "reference_over_torch": times["reference welford_stats"] / times["torch batch_norm_stats"]}
    out = {
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
    if "reference sequence" in times:
        out.update(reference_sequence_ms=times["reference sequence"] * 1e3,
                   torch_sequence_ms=times["torch sequence"] * 1e3,
                   sequence_over_torch=times["reference sequence"] / times["torch sequence"])
    out["meets_goal"] = (all(row["reference_over_torch"] <= GOAL_RATIO for row in ops.values())
                         and out["stats_over_copy_bandwidth"] >= GOAL_BANDWIDTH)
    return out


def bench_device_kernels(device: str = "cuda", repeat: int = 20, echo=print, shapes=None, timer=None) -> list[dict]:
    """Run the benchmark on ``device`` (see the module docstring), print a block per shape, return the figures."""
    from harness.kernels import extension

    extension.load()
    peak = device_peak_gb_per_s(device)
    where = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size if device == "cuda" else 0
    how = "CUDA-graph replays" if device == "cuda" and timer is None else "calls"
    echo(f"torch {torch.__version__} (CUDA {torch.version.cuda}) on {where}; median of {repeat} {how}")
    out = []
    for label, shape, dtype, fmt in shapes or CUDA_SHAPES:
        run = _Runner(device, shape, dtype, fmt, repeat, timer, l2)
        times = _time_shape(torch.ops.syncbn_ref, run)
        figures = {"shape": label, "dtype": str(dtype).replace("torch.", ""),
                   "layout": "channels_last" if fmt == torch.channels_last else "contiguous",
                   "shape_dims": list(shape), "device": where, "timing": run.timing(),
                   "calls_per_replay": run.calls, "input_copies": run.copies, "l2_resident": run.l2_resident,
                   **derive(times, run.nbytes, peak)}
        _print(figures, run.nbytes, echo)
        out.append(figures)
    met = sum(f["meets_goal"] for f in out)
    worst = max(((row["reference_over_torch"], op, f["shape"]) for f in out for op, row in f["ops"].items()),
                default=None)
    if worst:
        echo(f"\ngoal (every op within {GOAL_RATIO}x of torch's, statistics at {GOAL_BANDWIDTH:.0%} or more of copy "
             f"bandwidth) met on {met} of {len(out)} shapes; worst op ratio {worst[0]:.2f} ({worst[1]}, {worst[2]})")
    return out


class _Runner:
    """The inputs of one shape (rotated copies on CUDA) and the timer of one figure."""

    def __init__(self, device, shape, dtype, fmt, repeat, timer, l2):
        self.device, self.repeat, self.timer = device, repeat, timer
        g = torch.Generator().manual_seed(0)
        x = (torch.randn(shape, generator=g) * 2 + 1).to(dtype)
        dy = torch.randn(shape, generator=g).to(dtype)
        self.nbytes = x.numel() * x.element_size()
        graph = device == "cuda" and timer is None
        want = math.ceil(2 * l2 / max(self.nbytes, 1)) if graph else 1
        self.copies = max(1, min(MAX_COPIES, want))
        self.l2_resident = graph and self.copies * self.nbytes < l2
        self.calls = max(self.copies, 4) if graph else 1
        self.x = [x.to(device).contiguous(memory_format=fmt) for _ in range(self.copies)]
        self.dy = [dy.to(device).contiguous(memory_format=fmt) for _ in range(self.copies)]
        self.eager = 0
        self.k = 0

    def timing(self) -> str:
        if self.device != "cuda" or self.timer is not None:
            return "eager"
        return "cuda-graph" if not self.eager else f"cuda-graph ({self.eager} figures eager: capture failed)"

    def time(self, fn: Callable[[int], object]) -> float:
        """Median seconds of one call of ``fn(k)``, k the index of the input copy to use."""
        if self.device == "cuda" and self.timer is None:
            try:
                return _graph_time(fn, self.calls, self.copies, self.repeat)
            except RuntimeError:
                torch.cuda.synchronize()
                self.eager += 1
                return cuda_median_time(lambda: fn(self._next()), repeat=self.repeat)
        if self.timer is not None:
            return self.timer(lambda: fn(self._next()), repeat=self.repeat)
        from harness.bench.timing import median_time

        return median_time(lambda: fn(self._next()), repeat=self.repeat)

    def _next(self) -> int:
        self.k = (self.k + 1) % self.copies
        return self.k


def _graph_time(fn, calls: int, copies: int, repeat: int) -> float:
    """Median seconds per call of ``fn(k % copies)``, k < calls, captured in one CUDA graph and replayed."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture (allocator, library handles)
        for k in range(min(calls, 2)):
            fn(k % copies)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for k in range(calls):
            fn(k % copies)
    graph.replay()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / calls)
    del graph
    return statistics.median(times)


def _time_shape(ops, run: _Runner) -> dict[str, float]:
    """Median times of every figure's call for one shape."""
    from harness.impls.reference import SyncBatchNorm, _SyncBatchNormFunction

    xs, dys, device = run.x, run.dy, run.device
    x0, dy0 = xs[0], dys[0]
    C = x0.shape[1]
    w, b = torch.randn(C, device=device), torch.randn(C, device=device)
    rm, rv = torch.zeros(C, device=device), torch.ones(C, device=device)
    dst = [torch.empty_like(x) for x in xs]
    mean, invstd = torch.batch_norm_stats(x0, EPS)
    sum_dy, sum_dy_xmu, _, _ = torch.batch_norm_backward_reduce(dy0, x0, mean, invstd, w, True, True, True)
    n = x0.numel() // C
    count = torch.tensor([n], dtype=torch.int32, device=device)
    counts = torch.tensor([float(n)], device=device)
    args = {
        "batch_norm_stats": lambda k: (xs[k], EPS),
        "batch_norm_elemt": lambda k: (xs[k], w, b, mean, invstd, EPS),
        "batch_norm_backward_reduce": lambda k: (dys[k], xs[k], mean, invstd, w, True, True, True),
        "batch_norm_backward_elemt": lambda k: (dys[k], xs[k], mean, invstd, w, sum_dy, sum_dy_xmu, count),
        GATHER: lambda k: (xs[k], mean[None], invstd[None], rm, rv, 0.1, EPS, counts),
    }
    times = {"copy": run.time(lambda k: dst[k].copy_(xs[k]))}
    for op in OPS + (GATHER,):
        times[f"reference {op}"] = run.time(lambda k, op=op: getattr(ops, op)(*args[op](k)))
        times[f"torch {op}"] = run.time(lambda k, op=op: getattr(torch, op)(*args[op](k)))
    times["reference welford_stats"] = run.time(lambda k: ops.welford_stats(xs[k]))

    xg = [x.detach().clone().requires_grad_(True) for x in xs]
    wp, bp = torch.nn.Parameter(w.clone()), torch.nn.Parameter(b.clone())

    def ref_sequence(k):
        y = _SyncBatchNormFunction.apply(xg[k], wp, bp, rm, rv, EPS, 0.1, None, False)
        torch.autograd.grad(y, (xg[k], wp, bp), dys[k])

    def torch_sequence(k):  # torch SyncBatchNorm's ops for one training step, without the collectives
        m, i = torch.batch_norm_stats(xs[k], EPS)
        m, i = torch.batch_norm_gather_stats_with_counts(xs[k], m[None], i[None], rm, rv, 0.1, EPS, counts)
        torch.batch_norm_elemt(xs[k], w, b, m, i, EPS)
        s, sx, _, _ = torch.batch_norm_backward_reduce(dys[k], xs[k], m, i, w, True, True, True)
        torch.batch_norm_backward_elemt(dys[k], xs[k], m, i, w, s, sx, count)

    ref = SyncBatchNorm(C).to(device)

    def ref_module(k):
        y = ref(xg[k])
        torch.autograd.grad(y, (xg[k], ref.weight, ref.bias), dys[k])

    def cudnn(k):
        y = torch.nn.functional.batch_norm(xg[k], rm, rv, wp, bp, True, 0.1, EPS)
        torch.autograd.grad(y, (xg[k], wp, bp), dys[k])

    times["reference sequence"] = run.time(ref_sequence)
    times["torch sequence"] = run.time(torch_sequence)
    times["reference fwd+bwd"] = run.time(ref_module)
    times["torch fwd+bwd"] = run.time(cudnn)
    return times


def _print(f: dict, nbytes: int, echo) -> None:
    resident = ", L2-resident" if f["l2_resident"] else ""
    echo(f"\n{f['shape']}  ({nbytes / 1e6:.1f} MB per tensor{resident}; goal {'met' if f['meets_goal'] else 'missed'})")
    echo(f"  {'op':<36} {'reference ms':>12} {'torch ms':>10} {'ref/torch':>10}")
    for op, row in f["ops"].items():
        name = op if op != "welford_stats" else "welford_stats (vs torch stats)"
        echo(f"  {name:<36} {row['reference_ms']:12.4f} {row['torch_ms']:10.4f} {row['reference_over_torch']:9.2f}x")
    peak = (f", {f['stats_over_peak_bandwidth']:.2f} of the {f['peak_gbps']:.0f} GB/s peak"
            if f["peak_gbps"] else "")
    echo(f"  statistics pass (welford_stats): {f['stats_gbps']:.0f} GB/s = {f['stats_over_copy_bandwidth']:.2f} of "
         f"copy ({f['copy_gbps']:.0f} GB/s){peak}")
    if "sequence_over_torch" in f:
        echo(f"  fwd+bwd op sequence: reference {f['reference_sequence_ms']:.4f} ms, torch SyncBatchNorm's "
             f"{f['torch_sequence_ms']:.4f} ms: {f['sequence_over_torch']:.2f}x")
    echo(f"  fwd+bwd: reference module {f['reference_fwd_bwd_ms']:.4f} ms, torch F.batch_norm "
         f"{f['torch_fwd_bwd_ms']:.4f} ms: {f['reference_over_torch']:.2f}x")
