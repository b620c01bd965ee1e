"""The text of a short repro file, in blocks chosen by what the case and its symptom need.

:func:`render` joins a docstring, the case's constants (each with a comment
a maintainer can read) and fixed blocks of code. A block appears only where
the case needs it (subgroups, a memory format, hostile inputs, torch's CPU
stand-ins), so a plain case reads plainly. The blocks are literal code (raw
strings, so what is here is what the file holds); the only generated text is
the constants and the one line that says which quantity is observed.
``tests/repro`` writes files for planted defects and for correct controls and
runs them without the harness: that is what keeps these blocks honest.
"""

from __future__ import annotations

import textwrap

from harness.catalog.case import Case

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
    "non-finite": ("bool(torch.isfinite(got).all()) or not bool(torch.isfinite(want).all())",
                   r'f"{int((~torch.isfinite(got)).sum())} of {got.numel()} values NaN/Inf, expected '
                   r'{int((~torch.isfinite(want)).sum())}\n"'),
    "dtype": ("got.dtype == @@DTYPE@@", r'f"dtype {got.dtype}, expected {@@DTYPE@@}\n"'),
    "layout": ("got.numel() == 0 or got.is_contiguous(memory_format=MEMORY_FORMAT)",
               r'f"contiguous in {MEMORY_FORMAT}: {got.is_contiguous(memory_format=MEMORY_FORMAT)}\n"'),
    "shape": ("tuple(got.shape) == tuple(want.shape)", r'f"shape {tuple(got.shape)}, expected {tuple(want.shape)}\n"'),
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


def story(case: Case, target, symptom) -> str:
    """The docstring's paragraph: who runs what on which data, compared with what."""
    sizes = ", ".join(str(s) for s in case.batch_sizes)
    where = ("on CUDA (see below without a GPU)" if target.on_cuda else "on CUDA" if target.cuda_only
             else "(gloo, CPU)")
    extras = [w for ok, w in [(case.memory_format != "contiguous", case.memory_format),
                              (case.momentum is None, "momentum=None"), (not case.affine, "affine=False"),
                              (not case.track_running_stats, "track_running_stats=False"),
                              (case.groups is not None, f"process groups {[list(g) for g in case.groups or ()]}"),
                              (case.input_mean != 0.0 or case.input_scale != 1.0,
                               f"inputs {case.input_mean:g} + {case.input_scale:g} x N(offset, spread)"),
                              (bool(case.constant_channels), f"constant channels {list(case.constant_channels)}")]
              if ok]
    layer = "torch.nn.SyncBatchNorm" if target.name == "torch" else target.name.replace(":", ".")
    words = (f"{case.world_size} processes {where} run {layer} ({case.channels} channels, "
             f"{case.dtype} input, {case.param_dtype} parameters{''.join(', ' + e for e in extras)}) on their "
             f"parts of one batch ({sizes} samples of spatial size {tuple(case.spatial[0])}; steps: "
             f"{', '.join(case.steps)}) and compare {symptom.quantity or 'the output'} with "
             f"torch.nn.{BN_CLASS[case.ndim]} over the whole batch in float64.")
    return "\n".join(textwrap.wrap(words, 100, break_on_hyphens=False, break_long_words=False))


def constants(v: dict) -> str:
    """The case's constants, each with what it means."""
    sym = v["symptom"]
    lines = [f"C, SPATIAL = {v['c']}, {v['spatial']!r}  # channels; each rank's spatial size",
             f"STEP_SIZES = {v['step_sizes']!r}  # each step's batch size per rank",
             f"STEPS = {v['steps']!r}  # train, eval: forward and backward; nograd: training forward, no_grad",
             f"DTYPE, PARAM_DTYPE = {v['dtype']}, {v['param_dtype']}  # input; parameters and buffers",
             f"LAYER = dict(eps={v['layer']['eps']!r}, momentum={v['layer']['momentum']!r}, "
             f"affine={v['layer']['affine']!r}, track_running_stats={v['layer']['track_running_stats']!r})"]
    if v["groups"]:
        lines.append(f"GROUPS = {v['groups']!r}  # process subgroups; each normalizes over its own ranks")
    if v["fmt"] or v["gfmt"]:
        lines.append(f"MEMORY_FORMAT, GRAD_MEMORY_FORMAT = {v['fmt'] or 'torch.contiguous_format'}, "
                     f"{v['gfmt'] or 'torch.contiguous_format'}")
    if hostile(v):
        lines.append(f"INPUT_MEAN, INPUT_SCALE, CONSTANT_CHANNELS = {v['input_mean']!r}, {v['input_scale']!r}, "
                     f"{v['constant']!r}")
    lines += [f"SEED = {v['seed']}",
              f"SYMPTOM, QUANTITY, ERROR_TYPE = {sym.status!r}, {sym.quantity or 'output'!r}, "
              f"{sym.exception_type!r}  # what shows the defect",
              "# Tolerance: 16 unit roundoffs of the quantity's dtype, plus 16 of the accumulation type (float32;",
              "# float64 for float64 input) x log2(values per channel) x the input's max|x| / sqrt(var + eps)",
              f"U_Q, U_ACC = {v['u_q']!r}, {v['u_acc']!r}",
              f"BN = torch.nn.{BN_CLASS[v['ndim']]}"]
    return "\n".join(lines) + "\n"


def hostile(v: dict) -> bool:
    """Inputs other than the plain draws: an offset, a scale, constant channels."""
    return v["input_mean"] != 0.0 or v["input_scale"] != 1.0 or bool(v["constant"])


def data_block(v: dict) -> str:
    """The ``data`` function: hostile inputs where the case has them, normals in the case's dtype, from one
    generator or (a case drawn per rank) each rank's samples from a generator of its own."""
    draw, widen, drawn = NORMALS[v["normals"]]
    gens, ranks = "", "n, sp in zip(sizes, SPATIAL)"
    if v.get("draws") == "per-rank":
        draw = draw.replace("**f64)", "dtype=torch.float64, generator=g)").replace("generator=g)",
                                                                                 "generator=own[r])")
        drawn = drawn[:-1] + ",\n    each rank's by a generator of its own."
        gens = PER_RANK_GENERATORS.replace("@@RANK_SEEDS@@", repr(list(v["rank_seeds"])))
        ranks = "r, (n, sp) in enumerate(zip(sizes, SPATIAL))"
    return (DATA.replace("@@HOSTILE@@", HOSTILE if hostile(v) else "").replace("@@NORMALS@@", draw)
            .replace("@@WIDEN@@", widen).replace("@@DRAWN@@", drawn).replace("@@GENS@@", gens)
            .replace("@@RANKS@@", ranks))


def check_block(sym) -> str:
    """The ``check`` function for the symptom's aspect."""
    if sym.status != "mismatch" or sym.aspect == "value":
        return CHECK_VALUE
    if sym.aspect == "across-ranks":
        return CHECK_ACROSS
    cond, shown = CHECK_ASPECT[sym.aspect]
    dtype = "DTYPE" if sym.quantity in ("output", "grad_input") else "PARAM_DTYPE"
    return CHECK_ONE.replace("@@COND@@", cond.replace("@@DTYPE@@", dtype)).replace(
        "@@SHOWN@@", shown.replace("@@DTYPE@@", dtype))


def render(v: dict, *, cuda: bool, stand_ins: bool = True) -> str:
    """The whole file (see the module docstring); ``cuda`` without ``stand_ins``: a GPU is needed."""
    sym = v["symptom"]
    device = ('"cuda" if torch.cuda.is_available() else "cpu"' if stand_ins else '"cuda"') if cuda else '"cpu"'
    backend = ('"nccl" if DEVICE == "cuda" and torch.cuda.device_count() >= len(SPATIAL) else "gloo"'
               if cuda else '"gloo"')
    needs = "torch" if v["library"] == "torch" else f"torch and {v['library']}"
    needs = f"{needs} and a GPU ({v['library']}'s kernels here are CUDA kernels)" if cuda and not stand_ins else needs
    doc = [f'"""{v["title"].rstrip(".")}.', "", v["story"], "",
           *textwrap.wrap(f"Seen: {v['seen'].rstrip('.')}.", 100, break_on_hyphens=False, break_long_words=False),
           *textwrap.wrap(f"Needs only {needs}. Exit 1: the symptom shows; 0: it does not (fixed); 2: something "
                          "else failed.", 100, break_on_hyphens=False)]
    if cuda and stand_ins:
        doc += ["Without a GPU, torch's SyncBatchNorm runs over plain-torch CPU stand-ins for its five CUDA ops",
                "(stand_in_cuda_ops below): a symptom seen that way lives in torch's Python code."]
    quantity = sym.quantity or "output"
    across = sym.status == "mismatch" and sym.aspect == "across-ranks"
    gap = "\n\n" if "\ndef " in "\n" + v["import_line"] else ""  # two blank lines after a function
    parts = ["#!/usr/bin/env python3", "\n".join(doc) + '\n"""', IMPORTS, "\n" + v["import_line"] + "\n\n",
             gap + constants(v) + f"DEVICE = {device}\nBACKEND = {backend}\n{START[cuda]}\n",
             data_block(v), TOLERANCE,
             OBSERVE_DEF.replace("@@OBSERVE@@", OBSERVE[quantity])]
    if quantity in ("grad_weight", "grad_bias"):
        parts.append(TOTAL)
    parts.append(check_block(sym))
    if cuda and stand_ins:
        parts.append(CPU_STAND_INS)
    fmt, steps = v["fmt"] or v["gfmt"], v["steps"]
    nograd = "nograd" in steps
    if nograd:
        parts[2] = "import contextlib\n" + parts[2]
    own = not v["layer"]["track_running_stats"] and any(k not in ("train", "nograd") for k in steps)
    parts += [RANK.replace("@@DEVICE@@", (CUDA_DEVICE if stand_ins else CUDA_ONLY_DEVICE) if cuda else "")
              .replace("@@RANK0@@", RANK0 if "eval-rank0" in steps else "")
              .replace("@@FORWARD@@", FORWARD_NOGRAD if nograd else FORWARD)
              .replace("@@TOGETHER@@", TOGETHER_OWN if own else TOGETHER)
              .replace("@@GROUPS@@", GROUPS_BLOCK if v["groups"] else WORLD_BLOCK)
              .replace("@@FMT@@", ".to(memory_format=MEMORY_FORMAT)" if fmt else "")
              .replace("@@GFMT@@", ".to(memory_format=GRAD_MEMORY_FORMAT)" if fmt else "")
              .replace("@@CHECK_GROUP@@", ", group, members" if across else ""),
              MAIN.replace("@@NEEDS_GPU@@", NEEDS_GPU if cuda and not stand_ins else "")]
    return "\n".join(p.rstrip("\n") for p in parts) + "\n"
