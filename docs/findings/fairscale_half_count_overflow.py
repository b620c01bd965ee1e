#!/usr/bin/env python3
"""fairscale SyncBatchNorm, fully float16: the float16 count overflows, NaN running_var, outputs far off.

Root cause (shared with fairscale_half_count_autocast.py, float32 parameters): `_calculate_stats` keeps
the per-rank count and the group's total count in the input's dtype. Past 65,504 values per channel in the
group the float16 total is inf, each rank's weight count / total is 0, so the group's mean and mean square
are 0: the variance is 0, invstd is 1 / sqrt(eps), the output is x * weight / sqrt(eps) + bias (hundreds),
and the unbiased running variance is 0 * inf / inf = NaN. One root cause, two files: with float32
parameters (autocast) the same overflow happens, so this file and that one show the same defect.

What it runs: 2 processes (gloo, CPU), each with 16 samples of 4 channels x 56 x 56 (ResNet-50's layer1 at
16 per GPU: 50,176 values per channel per rank, 100,352 in the group; 4 channels instead of 64 keep the
run short, the count per channel is the same), one training forward of fairscale's SyncBatchNorm with
float16 parameters and buffers on float16 input (a model converted with .half()). Expected:
torch.nn.BatchNorm2d in float64 over the whole batch (the same float16-rounded values). Severity:
silent non-finite running statistics and outputs hundreds of times too large; reach: float16 models at
network sizes.

Thresholds: the symptom is a non-finite running_var on some channel (BatchNorm's is finite) together with
an output off BatchNorm's by more than 1.0 (its outputs are of order 1). It agrees when running_var is
finite and within 1e-2 relative of BatchNorm's and the output within 0.05 of BatchNorm's (float16 output
rounding and statistics).

Upstream: none found (fairscale's tracker, query "fairscale experimental SyncBatchNorm float16 count
overflow NaN"); fairscale has had no release since 0.4.13 (2022). Needs only torch and fairscale.
Exit codes: 1 the symptom above shows; 0 every rank agrees with BatchNorm as stated; 2 anything else
(reason printed: an exception, a rank that died, the time limit, a missing library, a partial disagreement).
With fairscale 0.4.13 on torch 2.13.0 it exits 1 on CPU.
"""
import datetime
import math
import queue
import signal
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

try:
    from fairscale.experimental.nn import SyncBatchNorm
except ImportError as exc:  # reported by main, exit 2
    SyncBatchNorm, IMPORT_ERROR = None, f"{type(exc).__name__}: {exc}"

C, SIZES, HW = 4, (16, 16), (56, 56)  # channels; samples per rank; spatial size
DTYPE, PARAM_DTYPE = torch.float16, torch.float16  # input; parameters and buffers
FAR, OUT_TOL, RV_TOL = 1.0, 0.05, 1e-2  # symptom: output off by more than FAR; agreement: within the tolerances
TIMEOUT_S, DEVICE = 45, "cpu"  # the whole run (the process group's own timeout is half of it); the device


def inputs():
    """The whole batch (float64 values exactly representable in float16) and the affine parameters."""
    g = torch.Generator().manual_seed(0)
    f64 = dict(dtype=torch.float64, generator=g)
    off, scale = torch.randn(C, **f64), torch.rand(C, **f64) + 0.5
    x = torch.randn(sum(SIZES), C, *HW, **f64) * scale.view(1, C, 1, 1) + off.view(1, C, 1, 1)
    weight, bias = torch.rand(C, **f64) + 0.5, torch.randn(C, **f64) * 0.5
    return x.to(DTYPE).double(), weight, bias


def rank_main(rank, world):
    """fairscale's layer on this rank's part, BatchNorm2d on the whole batch: what the judge needs."""
    x, weight, bias = inputs()
    start, n = sum(SIZES[:rank]), SIZES[rank]
    layer, bn = SyncBatchNorm(C).to(PARAM_DTYPE).train(), torch.nn.BatchNorm2d(C).double().train()
    with torch.no_grad():
        for m in (layer, bn):
            m.weight.copy_(weight), m.bias.copy_(bias)
    y = layer(x[start:start + n].to(DTYPE)).detach().double()
    want = bn(x).detach()[start:start + n]
    rv, want_rv = layer.running_var.double(), bn.running_var
    return dict(out_err=float((y - want).abs().max()), out_max=float(y.abs().max()),
                want_max=float(want.abs().max()), rv_nonfinite=int((~torch.isfinite(rv)).sum()),
                rv=rv.tolist(), want_rv=want_rv.tolist(),
                rv_err=float(((rv - want_rv).abs() / want_rv.abs()).nan_to_num(math.inf).max()))


def judge(got):
    """(exit code, verdict line) from every rank's result."""
    if failures(got, len(SIZES)):
        return 2, f"OTHER: {failures(got, len(SIZES))}"
    res = [got[r][1] for r in range(len(SIZES))]
    nonfinite, err = max(v["rv_nonfinite"] for v in res), max(v["out_err"] for v in res)
    facts = (f"running_var {res[0]['rv']} (BatchNorm2d's {[round(v, 4) for v in res[0]['want_rv']]}), "
             f"output off by up to {err:.4g} (largest |output| {max(v['out_max'] for v in res):.4g}, "
             f"BatchNorm2d's {max(v['want_max'] for v in res):.4g})")
    if nonfinite and err > FAR:
        return 1, (f"SYMPTOM SHOWS (non-finite): the float16 count overflowed: running_var non-finite on "
                   f"{nonfinite} of {C} channels, output off by more than {FAR}: {facts}")
    if not nonfinite and err <= OUT_TOL and max(v["rv_err"] for v in res) <= RV_TOL:
        return 0, f"no symptom (pass): agrees with torch.nn.BatchNorm2d over the whole batch: {facts}"
    return 2, f"OTHER: neither the overflow's signature nor agreement: {facts}"


def failures(got, world):
    """What went wrong outside the layer's results (an exception, a death, the time limit), or "" if nothing."""
    parts = [f"rank {r}: {kind} {what}" for r, (kind, what) in sorted(got.items()) if kind != "value"]
    missing = sorted(set(range(world)) - set(got))
    return "; ".join(parts + [f"rank(s) {missing} still running after {TIMEOUT_S} s (killed)"] * bool(missing))


def _rank(fn, rank, world, port, results):
    """One process: join the group, run fn, put (rank, ("value", v) or ("raised", what)) on the queue."""
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=TIMEOUT_S // 2))
        out = ("value", fn(rank, world))
    except Exception as exc:  # reported to the parent, which judges it
        out = ("raised", f"{type(exc).__name__}: {exc}")
    results.put((rank, out))
    if dist.is_initialized():
        dist.destroy_process_group()


def run_ranks(fn, world):
    """fn(rank, world) in `world` processes: {rank: ("value", v) | ("raised", what) | ("died", how)}. Every wait
    is bounded by TIMEOUT_S; a process still running then is killed (its rank is missing); all are reaped."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(fn, r, world, port, results)) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + TIMEOUT_S
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    got = {}
    try:
        while True:
            rank, out = results.get(timeout=0.5)
            got[rank] = out
    except queue.Empty:
        pass
    for r, p in enumerate(procs):
        if p.is_alive():  # past the time limit: its rank is missing
            p.kill()
            p.join(timeout=5)
        elif r not in got:
            code = p.exitcode
            got[r] = ("died", f"exit code {code}" if code >= 0 else f"signal {signal.Signals(-code).name}")
    results.close()
    return got


def main():
    if SyncBatchNorm is None:
        print(f"OTHER: needs fairscale ({IMPORT_ERROR})")
        return 2
    code, line = judge(run_ranks(rank_main, len(SIZES)))
    print(line)
    return code


if __name__ == "__main__":
    sys.exit(main())
