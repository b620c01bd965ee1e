#!/usr/bin/env python3
"""apex: a rank dies (SIGFPE).

2 processes on CUDA run apex (5 channels, float16 input, float32 parameters, inputs 0.5 + 2 x
N(offset, spread)) on their parts of one batch (0, 5 samples of spatial size (4, 3); steps: train)
and compare the output with torch.nn.BatchNorm2d over the whole batch in float64.

Every wait is bounded: the process group's timeout is 60 s, the whole run 120 s (10 s more for the other
ranks once one has raised or died); ranks still running then are terminated, then killed, and all are reaped.
A rank killed by SIGFPE is the crash this file is about; any other signal is OTHER (exit 2).

Seen: crash on torch 2.11.0+cu130 (optimized) with apex, cuda/gloo, syncbn-harness case
allgather-shape/empty-0-5/float16-float32/contiguous/ws2.
Needs only torch and apex and a GPU (apex's kernels here are CUDA kernels). Exit 1: the symptom
shows; 0: it does not (fixed); 2: something else failed.
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
    from apex.parallel import SyncBatchNorm
except ImportError as exc:  # reported by main, exit 2
    SyncBatchNorm, IMPORT_ERROR = None, f"{type(exc).__name__}: {exc}"
C, SPATIAL = 5, [(4, 3), (4, 3)]  # channels; each rank's spatial size
STEP_SIZES = [[0, 5]]  # each step's batch size per rank
STEPS = ['train']  # train, eval: forward and backward; nograd: training forward, no_grad
DTYPE, PARAM_DTYPE = torch.float16, torch.float32  # input; parameters and buffers
LAYER = dict(eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)
INPUT_MEAN, INPUT_SCALE, CONSTANT_CHANNELS = 0.5, 2.0, []
SEED = 1499684978
SYMPTOM, QUANTITY, ERROR_TYPE = 'crash', 'output', None  # what shows the defect
# Tolerance: 16 unit roundoffs of the quantity's dtype, plus 16 of the accumulation type (float32;
# float64 for float64 input) x log2(values per channel) x the input's max|x| / sqrt(var + eps)
U_Q, U_ACC = 0.00048828125, 5.960464477539063e-08
BN = torch.nn.BatchNorm2d
TIMEOUT_S, GRACE_S, DEVICE = 120, 10, "cuda"  # the whole run (the process group's timeout is half of it); the
# time the other ranks get once one has raised or died; the device


def data():
    """The parameters and each step's per-rank (input, upstream gradient), drawn in float64 from SEED."""
    g = torch.Generator().manual_seed(SEED)
    f64 = dict(dtype=torch.float64, generator=g)
    off, scale = torch.randn(C, **f64), torch.rand(C, **f64) * 1.5 + 0.5
    sign = torch.where(torch.rand(C, generator=g) < 0.3, -1.0, 1.0).double()
    params = dict(weight=sign * (torch.rand(C, **f64) * 1.5 + 0.25), bias=torch.randn(C, **f64) * 0.5,
                  running_mean=torch.randn(C, **f64) * 0.1, running_var=torch.rand(C, **f64) * 0.5 + 0.75)
    steps = []
    for sizes in STEP_SIZES:
        steps.append([])
        for n, sp in zip(sizes, SPATIAL):
            shape, b = (n, C, *sp), (1, C) + (1,) * len(sp)
            x = torch.randn(shape, **f64) * scale.view(b) + off.view(b)
            x = x * INPUT_SCALE + INPUT_MEAN
            for c in CONSTANT_CHANNELS:
                x[:, c] = INPUT_MEAN + INPUT_SCALE * off[c]
            steps[-1].append((x.to(DTYPE).double(), torch.randn(shape, **f64).to(DTYPE).double()))
    return {k: v.to(PARAM_DTYPE) for k, v in params.items()}, steps


def tolerance(x):  # normwise, relative; x: the whole batch, whose max|x| / sqrt(var + eps) is its conditioning
    dims, k, x = [0, *range(2, x.dim())], x.numel() // C, x.detach()
    cond = float((x.abs().amax(dims) / (x.var(dims, correction=0) + LAYER["eps"]).sqrt()).max()) if k else 1.0
    return 16 * U_Q + 16 * U_ACC * max(math.log2(max(k, 1)), 1) * cond


def observe(module, y, grad, group=False):  # QUANTITY after a step
    return y.detach()


def check(rank, s, kind, got, want, tol):
    """Compare one step's QUANTITY with BatchNorm's; print expected against actual; True if they agree."""
    got, want = got.detach().double().cpu().flatten(), want.detach().flatten()
    if want.numel() == 0:
        return True  # this rank's part of the batch is empty
    i = int((got - want).abs().nan_to_num(math.inf).argmax())
    rel = float((got - want).abs().max() / want.abs().max().clamp_min(1e-300))
    print(f"rank {rank} step {s} ({kind}) {QUANTITY}: expected {float(want[i]):.6g}, actual {float(got[i]):.6g} "
          f"(element {i}); max rel err {rel:.3g} {'<=' if rel <= tol else '>'} tol {tol:.3g}\n", end="")
    return rel <= tol


def rank_main(rank, world):
    """The layer on this rank's part of each step's batch, beside BatchNorm on the whole batch: True if the
    two agree at every step."""
    members, group = list(range(len(SPATIAL))), None
    params, steps = data()
    layer = SyncBatchNorm(C, **LAYER, process_group=group).to(DEVICE, PARAM_DTYPE)
    bn = BN(C, **LAYER).double()  # the expectation: float64, over the whole batch of the group
    layer.load_state_dict(params, strict=False)
    bn.load_state_dict({k: v.double() for k, v in params.items()}, strict=False)
    agrees = True
    for s, (kind, sizes, row) in enumerate(zip(STEPS, STEP_SIZES, steps)):
        train = kind in ("train", "nograd")
        layer.train(train), bn.train(train)
        together = members
        xs = torch.cat([row[r][0] for r in together]).requires_grad_()
        x = row[rank][0].to(DEVICE, DTYPE).requires_grad_()
        ys, y = bn(xs), layer(x)
        ys.backward(torch.cat([row[r][1] for r in together])), y.backward(row[rank][1].to(DEVICE, DTYPE))
        start = sum(sizes[r] for r in together if r < rank)
        part = slice(start, start + sizes[rank])
        want = observe(bn, ys[part], None if xs.grad is None else xs.grad[part])
        agrees &= check(rank, s, kind, observe(layer, y, x.grad, group), want, tolerance(xs))
        layer.zero_grad(set_to_none=True), bn.zero_grad(set_to_none=True)
    return agrees


def seen_on(kind, what):
    """What one rank's outcome shows: pass, mismatch, error (ERROR_TYPE raised), hang (a collective timed out, or
    still running at the time limit), crash (killed by SIGFPE) or other."""
    if kind == "value":
        return "pass" if what else "mismatch"
    if kind == "raised":
        return "hang" if "imed out" in what else "error" if what.startswith(f"{ERROR_TYPE}: ") else "other"
    if kind == "died":
        return "crash" if what == "signal SIGFPE" else "other"  # the division by zero this file is about
    return "hang"  # stopped: still running at its deadline


def judge(got):
    """(exit code, verdict line): the SYMPTOM if any rank shows it, pass if every rank agrees, else OTHER."""
    seen = {r: seen_on(*out) for r, out in sorted(got.items())}
    kinds = set(seen.values())
    if kinds == {"pass"}:
        return 0, "no symptom (pass): every rank agrees with torch.nn.BatchNorm over the whole batch"
    what = "; ".join(f"rank {r}: {s}" + ("" if got[r][0] == "value" else f" ({got[r][0]}: {one_line(got[r][1])})")
                     for r, s in seen.items() if s != "pass")
    if SYMPTOM in kinds:
        return 1, f"SYMPTOM SHOWS ({SYMPTOM}): {what}"
    first = next(k for k in ("crash", "error", "hang", "other", "mismatch") if k in kinds)
    return 2, f"OTHER ({first}): {what}"


def _rank(fn, rank, world, port, results):
    """One process: join the group, run fn, put (rank, ("value", v) or ("raised", what)) on the queue."""
    try:
        backend = "gloo"
        if DEVICE == "cuda":
            torch.cuda.set_device(rank % torch.cuda.device_count())
            backend = "nccl" if torch.cuda.device_count() >= world else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=TIMEOUT_S // 2))
        out = ("value", fn(rank, world))
    except Exception as exc:  # reported to the parent, which judges it
        out = ("raised", f"{type(exc).__name__}: {exc}")
    results.put((rank, out))
    if dist.is_initialized():
        dist.destroy_process_group()


def _signal_name(number):
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal number {number}"


def run_ranks(fn, world):
    """fn(rank, world) in `world` processes: {rank: ("value", v) | ("raised", what) | ("died", how) |
    ("stopped", why)}. Every wait is bounded: the whole run by TIMEOUT_S, and once a rank has raised or died the
    others get GRACE_S more to report theirs; a process still running at its deadline is terminated, then
    killed ("stopped"); all are reaped. A rank killed by a signal died "signal <name>"."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(fn, r, world, port, results)) for r in range(world)]
    got, deadline, why, stopped = {}, time.monotonic() + TIMEOUT_S, f"still running after {TIMEOUT_S} s", {}
    try:
        for p in procs:
            p.start()
        while len(got) < world and time.monotonic() < deadline:
            try:
                rank, out = results.get(timeout=0.5)
                got[rank] = out
            except queue.Empty:
                ended = [r for r, p in enumerate(procs) if r not in got and p.exitcode is not None]
                if ended:  # a result put just before the exit is read first
                    time.sleep(0.5)
                    while True:
                        try:
                            rank, out = results.get(timeout=0.1)
                            got[rank] = out
                        except queue.Empty:
                            break
                    for r in ended:
                        code = procs[r].exitcode
                        how = f"exit code {code}" if code >= 0 else f"signal {_signal_name(-code)}"
                        got.setdefault(r, ("died", how))
            failed = [r for r, (kind, _) in got.items() if kind != "value"]
            if failed and time.monotonic() + GRACE_S < deadline:
                deadline = time.monotonic() + GRACE_S
                why = f"still running {GRACE_S} s after rank {failed[0]} failed"
    finally:
        for r, p in enumerate(procs):
            if p.pid is None:  # never started
                continue
            p.join(timeout=max(0.0, min(5.0, deadline - time.monotonic())))
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
                stopped[r] = "terminated"
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
                stopped[r] = "killed" if not p.is_alive() else "still alive after SIGKILL"
        results.close()
    for r in range(world):
        got.setdefault(r, ("stopped", f"{why} ({stopped.get(r, 'ended by itself at the deadline')})"))
    return got


def one_line(text, limit=400):
    """A rank's report on one line (the verdict is one line), in ASCII, cut at `limit` characters."""
    text = " ".join(str(text).split()).encode("ascii", "backslashreplace").decode("ascii")
    return text if len(text) <= limit else text[:limit] + " ..."


def main():
    """Spawn the ranks; exit 1 if the SYMPTOM shows, 0 if every rank agrees with BatchNorm, 2 otherwise."""
    if SyncBatchNorm is None:
        print(f"OTHER: needs apex ({IMPORT_ERROR})")
        return 2
    if not torch.cuda.is_available():
        print("OTHER: needs a GPU (apex's optimized SyncBatchNorm runs CUDA kernels)")
        return 2
    if SyncBatchNorm.__module__ != "apex.parallel.optimized_sync_batchnorm":
        print(f"OTHER: needs apex built with its syncbn CUDA extension (got {SyncBatchNorm.__module__})")
        return 2
    code, line = judge(run_ranks(rank_main, len(SPATIAL)))
    print(line)
    return code


if __name__ == "__main__":
    try:
        CODE = main()
    except Exception as exc:  # the run itself failed: not the symptom
        print(f"OTHER: {one_line(f'{type(exc).__name__}: {exc}')}")
        CODE = 2
    sys.exit(CODE)
