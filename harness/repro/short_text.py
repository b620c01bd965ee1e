"""The blocks of literal code a short repro file is made of.

Each block is literal code (raw strings, so what is here is what the file
holds), with ``@@NAME@@`` markers where :mod:`harness.repro.short_file`
puts a constant, a name or a smaller block. Which blocks a file holds
depends on the case and its symptom (subgroups, a memory format, hostile
inputs, torch's CPU stand-ins), so a plain case reads plainly; that choice is
:meth:`harness.repro.short_file.ShortFile.render`'s. ``tests/repro`` writes
files for planted defects and for correct controls and runs them without the
harness: that is what keeps these blocks honest.
"""

from __future__ import annotations

from harness.judge.metric import Problem

BN_CLASS = {2: "BatchNorm1d", 3: "BatchNorm1d", 4: "BatchNorm2d", 5: "BatchNorm3d"}

# How the ranks start: forked on CPU, where they inherit this process's imports instead of each importing
# torch again (seconds a rank); spawned for CUDA, so that no rank inherits CUDA state from a library that
# touched CUDA when it was imported.
START = {False: 'START = "fork"  # the ranks inherit the imports above',
         True: 'START = "spawn" if DEVICE == "cuda" else "fork"  # a CUDA rank inherits no CUDA state'}

IMPORTS = r"""import datetime
import math
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
"""

DATA = r'''

def data():
    """The parameters and each step's per-rank (input, upstream gradient), @@DRAWN@@"""
    g = torch.Generator().manual_seed(SEED)
    f64 = dict(dtype=torch.float64, generator=g)
    off, scale = torch.randn(C, **f64), torch.rand(C, **f64) * 1.5 + 0.5
    sign = torch.where(torch.rand(C, generator=g) < 0.3, -1.0, 1.0).double()
    params = dict(weight=sign * (torch.rand(C, **f64) * 1.5 + 0.25), bias=torch.randn(C, **f64) * 0.5,
                  running_mean=torch.randn(C, **f64) * 0.1, running_var=torch.rand(C, **f64) * 0.5 + 0.75)
@@GENS@@    steps = []
    for sizes in STEP_SIZES:
        steps.append([])
        for @@RANKS@@:
            shape, b = (n, C, *sp), (1, C) + (1,) * len(sp)
            x = @@NORMALS@@@@WIDEN@@ * scale.view(b) + off.view(b)
@@HOSTILE@@            steps[-1].append((x.to(DTYPE).double(), @@NORMALS@@.to(DTYPE).double()))
    return {k: v.to(PARAM_DTYPE) for k, v in params.items()}, steps
'''

# The samples' standard normals, drawn in float64 or (search's cases) in float32: the draw, what widens it for
# the input's arithmetic, and the end of the data's docstring.
NORMALS = {"float64": ("torch.randn(shape, **f64)", "", "drawn in float64 from SEED."),
           "float32": ("torch.randn(shape, dtype=torch.float32, generator=g)", ".double()",
                       "made in float64\n    from SEED's standard normals, the samples' drawn in float32.")}

# A case drawn per rank: each rank's samples come from a generator of its own, seeded as the case says.
PER_RANK_GENERATORS = "    own = [torch.Generator().manual_seed(s) for s in @@RANK_SEEDS@@]\n"

HOSTILE = r"""            x = x * INPUT_SCALE + INPUT_MEAN
            for c in CONSTANT_CHANNELS:
                x[:, c] = INPUT_MEAN + INPUT_SCALE * off[c]
"""

TOLERANCE = r'''

def tolerance(x):  # normwise, relative; x: the whole batch, whose max|x| / sqrt(var + eps) is its conditioning
    dims, k, x = [0, *range(2, x.dim())], x.numel() // C, x.detach()
    cond = float((x.abs().amax(dims) / (x.var(dims, correction=0) + LAYER["eps"]).sqrt()).max()) if k else 1.0
    return 16 * U_Q + 16 * U_ACC * max(math.log2(max(k, 1)), 1) * cond
'''

# The quantity a step is judged by, on the layer (a rank's gradient share is summed over its group) and on
# BatchNorm (``group is False``: it holds the whole batch already).
OBSERVE = {
    "output": "y.detach()",
    "grad_input": "grad",
    "grad_weight": "module.weight.grad if group is False else total(module.weight.grad, group)",
    "grad_bias": "module.bias.grad if group is False else total(module.bias.grad, group)",
    "running_mean": "module.running_mean.detach().clone()",
    "running_var": "module.running_var.detach().clone()",
    "num_batches_tracked": "module.num_batches_tracked.double()",
}

OBSERVE_DEF = r'''

def observe(module, y, grad, group=False):  # QUANTITY after a step
    return @@OBSERVE@@
'''

TOTAL = r'''

def total(share, group):  # a rank's gradient share summed over its group (what DDP will then use)
    share = share.detach().double().cpu()
    dist.all_reduce(share, group=group)
    return share
'''

CHECK_VALUE = r'''

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
'''

# What is wrong with the quantity, when it is not its values: (the test, what is printed).
CHECK_ASPECT = {
    Problem.NON_FINITE: ("bool(torch.isfinite(got).all()) or not bool(torch.isfinite(want).all())",
                         r'f"{int((~torch.isfinite(got)).sum())} of {got.numel()} values NaN/Inf, expected '
                         r'{int((~torch.isfinite(want)).sum())}\n"'),
    Problem.DTYPE: ("got.dtype == @@DTYPE@@", r'f"dtype {got.dtype}, expected {@@DTYPE@@}\n"'),
    Problem.LAYOUT: ("got.numel() == 0 or got.is_contiguous(memory_format=MEMORY_FORMAT)",
                     r'f"contiguous in {MEMORY_FORMAT}: {got.is_contiguous(memory_format=MEMORY_FORMAT)}\n"'),
    Problem.SHAPE: ("tuple(got.shape) == tuple(want.shape)",
                    r'f"shape {tuple(got.shape)}, expected {tuple(want.shape)}\n"'),
}

CHECK_ONE = r'''

def check(rank, s, kind, got, want, tol):
    """Check one step's QUANTITY; print what was found; True if it is as BatchNorm's."""
    ok = @@COND@@
    print(f"rank {rank} step {s} ({kind}) {QUANTITY}: " + @@SHOWN@@, end="")
    return ok
'''

CHECK_ACROSS = r'''

def check(rank, s, kind, got, want, tol, group, members):
    """Every rank of the group must hold bitwise the same QUANTITY; print whether they do."""
    everyone = [None] * len(members)
    dist.all_gather_object(everyone, torch.as_tensor(got).detach().cpu(), group=group)
    same = all(torch.equal(t, everyone[0]) for t in everyone)
    print(f"rank {rank} step {s} ({kind}) {QUANTITY}: ranks {members} agree bitwise: {same}\n", end="")
    return same
'''

RANK = r'''

def rank_main(rank, port):
    """The layer on this rank's part of each step's batch, beside BatchNorm on the whole batch."""
@@DEVICE@@    dist.init_process_group(BACKEND, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=len(SPATIAL),
                            timeout=datetime.timedelta(seconds=60))
@@GROUPS@@    params, steps = data()
    layer = SyncBatchNorm(C, **LAYER, process_group=group).to(DEVICE, PARAM_DTYPE)
    bn = BN(C, **LAYER).double()  # the expectation: float64, over the whole batch of the group
    layer.load_state_dict(params, strict=False)
    bn.load_state_dict({k: v.double() for k, v in params.items()}, strict=False)
    agrees = True
    for s, (kind, sizes, row) in enumerate(zip(STEPS, STEP_SIZES, steps)):
@@RANK0@@        train = kind in ("train", "nograd")
        layer.train(train), bn.train(train)
@@TOGETHER@@        xs = torch.cat([row[r][0] for r in together]).requires_grad_()
        x = row[rank][0].to(DEVICE, DTYPE)@@FMT@@.requires_grad_()
@@FORWARD@@        start = sum(sizes[r] for r in together if r < rank)
        part = slice(start, start + sizes[rank])
        want = observe(bn, ys[part], None if xs.grad is None else xs.grad[part])
        agrees &= check(rank, s, kind, observe(layer, y, x.grad, group), want, tolerance(xs)@@CHECK_GROUP@@)
        layer.zero_grad(set_to_none=True), bn.zero_grad(set_to_none=True)
    dist.destroy_process_group()
    sys.exit(0 if agrees else 1)
'''

# Lines only some step sequences need: validation on rank 0 alone, forwards under no_grad, eval steps
# that normalize with each rank's own statistics (no running statistics to use).
RANK0 = r"""        if kind == "eval-rank0" and rank != 0:
            continue  # validation on rank 0 alone: the others wait (eval changes no buffer)
"""
FORWARD_NOGRAD = r"""        with torch.no_grad() if kind == "nograd" else contextlib.nullcontext():
            ys, y = bn(xs), layer(x)
        if kind != "nograd":
            ys.backward(torch.cat([row[r][1] for r in together])), y.backward(row[rank][1].to(DEVICE, DTYPE)@@GFMT@@)
"""
FORWARD = r"""        ys, y = bn(xs), layer(x)
        ys.backward(torch.cat([row[r][1] for r in together])), y.backward(row[rank][1].to(DEVICE, DTYPE)@@GFMT@@)
"""
TOGETHER_OWN = r"""        together = members if train or LAYER["track_running_stats"] else [rank]  # eval: own statistics
"""
TOGETHER = r"""        together = members
"""

GROUPS_BLOCK = r"""    groups = [dist.new_group(g) for g in GROUPS]  # every rank makes every group, in the same order
    members = next(g for g in GROUPS if rank in g)
    group = groups[GROUPS.index(members)]
"""
WORLD_BLOCK = r"""    members, group = list(range(len(SPATIAL))), None
"""

MAIN = r'''

def main():
    """Start the ranks; exit 1 if the SYMPTOM shows, 0 if every rank agrees with BatchNorm, 2 otherwise."""
@@NEEDS_GPU@@    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        mp.start_processes(rank_main, (port,), nprocs=len(SPATIAL), start_method=START)
        seen, what = "pass", "every rank agrees with torch.nn.BatchNorm over the whole batch"
    except mp.ProcessRaisedException as e:  # a rank raised (a collective times out after 60 s): the traceback
        seen, what = ("hang" if "imed out" in str(e) else "error" if f"\n{ERROR_TYPE}: " in str(e) else "other"), e
    except mp.ProcessExitedException as e:  # a rank found a disagreement (exit 1) or died
        seen, what = ("crash" if e.signal_name else "mismatch" if e.exit_code == 1 else "other"), e
    print(f"{'SYMPTOM SHOWS' if seen == SYMPTOM else 'no symptom' if seen == 'pass' else 'OTHER'} ({seen}): {what}")
    return 1 if seen == SYMPTOM else 0 if seen == "pass" else 2


if __name__ == "__main__":
    sys.exit(main())
'''

CUDA_DEVICE = r"""    if DEVICE == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    else:
        stand_in_cuda_ops()
"""
CUDA_ONLY_DEVICE = r"""    torch.cuda.set_device(rank % torch.cuda.device_count())
"""
NEEDS_GPU = r"""    if not torch.cuda.is_available():
        print("OTHER: needs a GPU (the layer's kernels here are CUDA kernels)")
        return 2
"""

CPU_STAND_INS = r'''

def stand_in_cuda_ops():
    """No GPU: plain-torch CPU stand-ins for the five CUDA-only ops torch's SyncBatchNorm calls (statistics
    in float32, float64 for float64 input, and the gather's dtype checks, as CUDA has them), and its device
    check told "cpu" is an accelerator. What runs is torch's own Python code (nn.SyncBatchNorm,
    torch/nn/modules/_functions.py) over these."""
    acc = lambda t: torch.float64 if t == torch.float64 else torch.float32  # noqa: E731
    d, c = lambda t: [0, *range(2, t.dim())], lambda v, t: v.view(1, -1, *[1] * (t.dim() - 2))  # noqa: E731
    c10 = {torch.float64: "Double", torch.float32: "Float", torch.float16: "Half", torch.bfloat16: "BFloat16"}

    def stats(x, eps):
        var, mean = torch.var_mean(x.to(acc(x.dtype)), d(x), correction=0)
        return mean, (var + eps).rsqrt()

    def gather_stats_with_counts(x, mean, invstd, rm, rv, momentum, eps, counts):
        t = x.dtype if rm is None else rm.dtype  # CUDA dispatches on it and reads the counts as it
        for name, v, want in (("mean", mean, acc(t)), ("invstd", invstd, acc(t)), ("counts", counts, t)):
            if v.dtype != want:
                raise RuntimeError(f"Expected {name} to have type {c10[want]} but got {c10[v.dtype]}")
        m, var_n, n = torch.zeros_like(mean[0]), torch.zeros_like(mean[0]), 0.0  # merged rank by rank, as CUDA
        for j, cnt in enumerate(counts):  # does, n + count in the counts' dtype (float16: inf past 65,504)
            f = (torch.tensor(n, dtype=counts.dtype) + cnt).to(mean.dtype).reciprocal()
            var_n = var_n + (invstd[j] ** -2 - eps + (m - mean[j]) ** 2 * n * f) * float(cnt)
            m, n = n * f * m + float(cnt) * f * mean[j], n + float(cnt)
        var = var_n / n
        if rm is not None:
            rm.mul_(1 - momentum).add_((m * momentum).to(rm.dtype))
            rv.mul_(1 - momentum).add_((var * n / (n - 1) * momentum).to(rv.dtype))
        return m, (var + eps).rsqrt()

    def elemt(x, w, b, mean, invstd, eps):
        y = (x.to(mean.dtype) - c(mean, x)) * c(invstd, x)
        return (y if w is None else y * c(w.to(mean.dtype), x) + c(b.to(mean.dtype), x)).to(x.dtype)

    def backward_reduce(dy, x, mean, invstd, w, input_g, weight_g, bias_g):
        dy, xmu = dy.to(mean.dtype), x.to(mean.dtype) - c(mean, x)
        s, sx = dy.sum(d(x)), (dy * xmu).sum(d(x))
        return s, sx, (sx * invstd).to(w.dtype) if weight_g else None, s.to(w.dtype) if bias_g else None

    def backward_elemt(dy, x, mean, invstd, w, s, sx, count):
        n, k = count.sum().to(mean.dtype), invstd if w is None else invstd * w.to(mean.dtype)
        xmu = x.to(mean.dtype) - c(mean, x)
        return ((dy.to(mean.dtype) - c(s / n, x) - xmu * c(invstd**2 * sx / n, x)) * c(k, x)).to(dy.dtype)

    stand_in_cuda_ops.lib = torch.library.Library("aten", "IMPL")  # kept: the registrations live with it
    for fn in (stats, gather_stats_with_counts, elemt, backward_reduce, backward_elemt):
        stand_in_cuda_ops.lib.impl(f"batch_norm_{fn.__name__}", fn, "CPU")
    torch._C._get_privateuse1_backend_name = lambda: "cpu"
'''

