"""CUDA's per-channel reductions in the SyncBN ops, partial by partial: launch shape, each thread's loop, the merges.

Part of :mod:`harness.impls.cuda_arith` (its design note says what is modelled and why); these are the four
reductions, each given a CPU tensor laid out as its kernel indexes it and returning what the kernel writes. Read
from ``Normalization.cuh``, ``block_reduce.cuh`` and ``LaunchUtils.h`` as shipped in the torch 2.13.0 (cf30153c4c13)
and 2.14.1 (5c4886908584) wheels, which are identical there:

- contiguous kernels, one block per channel over the input read as [N, C, L]: thread (x, y) walks rows y, y + by,
  ... and in each the features x, x + bx, ... (:func:`_thread_items`);
  ``batch_norm_collect_statistics_kernel`` then merges Welford triples across the 32 lanes of a warp by XOR
  shuffles, lane 0 of each warp through shared memory, and again (:func:`welford_contiguous`);
  ``batch_norm_backward_reduce_kernel`` sums ``Float2`` pairs with ``BlockReduce`` (shuffle-down within each
  warp, lane 0 of each warp into warp 0, shuffle-down again) (:func:`grad_sums_contiguous`).
- channels-last kernels over the input read as [R, C] (R = N * spatial): ``flexible_launch_configs`` gives blocks
  of (bx channels, by rows) and gy blocks along R; each thread keeps 4 partials (one per load in flight), merges
  them, then a tree over threadIdx.y, then, when gy > 1, the block that finishes last merges the gy partials
  (:func:`welford_channels_last`, :func:`grad_sums_channels_last`).

Everything is elementwise torch arithmetic on CPU in the kernel's dtype, vectorized over channels and threads;
Python loops run over a thread's items and the levels of a tree only. nvcc may contract a multiply and an add
into one FMA: results agree with a GPU to a few roundings of the accumulation dtype, not bit for bit.
"""

from __future__ import annotations

from typing import Optional

import torch

WARP = 32
MAX_BLOCK = 512  # MAX_BLOCK_SIZE (CUDA builds)
LOADS = 4  # ELEMENTS_PER_ITER: loads in flight per thread in the channels-last kernels
PER_THREAD = 16  # ELEMENTS_PER_THREAD
TILE_W = 32  # OPTIMAL_TILE_W
MAX_H_BLOCK = 128


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def last_pow2(n: int) -> int:
    """``lastPow2``: the largest power of two <= n (of n as a 32-bit unsigned), at least 1."""
    n &= 0xFFFFFFFF
    for s in (1, 2, 4, 8, 16):
        n |= n >> s
    return max(1, n - (n >> 1))


def num_threads(n: int) -> int:
    """``getNumThreads``: the smallest of 32, 64, 128, 256 that holds n, else 512."""
    return next((t for t in (32, 64, 128, 256) if n <= t), MAX_BLOCK)


def flexible_launch(reduction: int, stride: int, coop: bool) -> tuple:
    """``flexible_launch_configs``: (block_x, block_y, grid_x, grid_y) of a channels-last kernel.

    ``coop`` (the reductions): a grid_y below 8 becomes 1. An empty input gives grid_y 0 without it."""
    bx = min(last_pow2(stride), TILE_W)
    by = min(last_pow2(ceil_div(reduction, PER_THREAD)), MAX_BLOCK // bx)
    if bx * by != MAX_BLOCK:
        bx = min(last_pow2(stride), MAX_BLOCK // by)
    gy = min(ceil_div(reduction, by * PER_THREAD), MAX_H_BLOCK)
    if coop and gy < 8:
        gy = 1
    return bx, by, ceil_div(stride, bx), gy


# ------------------------------------------------------------------ contiguous kernels: input read as [N, C, L]

def _thread_items(t: torch.Tensor, by: int, bx: int) -> tuple:
    """[N, C, L] -> ([C, by, bx, K] values, same-shaped validity): thread (x, y)'s items in its loop order."""
    n, c, ln = t.shape
    nb, nl = ceil_div(n, by), ceil_div(ln, bx)
    pad = t.new_zeros(nb * by, c, nl * bx)
    pad[:n, :, :ln] = t
    ok = torch.zeros(pad.shape, dtype=torch.bool)
    ok[:n, :, :ln] = True

    def arrange(p):  # (row block, y, C, feature block, x) -> (C, y, x, row block * feature block)
        return p.reshape(nb, by, c, nl, bx).permute(2, 1, 4, 0, 3).reshape(c, by, bx, nb * nl)

    return arrange(pad), arrange(ok)


def _count_recip(total: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """``1.0 / fmaxf(1.0, n + o_n)``: the int sum as a float, at least 1, inverted in double, stored as acc."""
    return (1.0 / total.to(torch.float32).clamp(min=1.0).double()).to(acc)


def _welford_xor(avg, var_n, n, acc):
    """The XOR-shuffle Welford merge over the last dim (32 lanes), every lane merging with lane ^ 2**i."""
    lane = torch.arange(WARP)
    for i in range(5):
        p = lane ^ (1 << i)
        o_avg, o_var, o_n = avg[..., p], var_n[..., p], n[..., p]
        factor = _count_recip(n + o_n, acc)
        d = avg - o_avg
        var_n = var_n + (o_var + d * d * n.to(acc) * o_n.to(acc) * factor)
        avg = (n.to(acc) * avg + o_n.to(acc) * o_avg) * factor
        n = n + o_n
    return avg, var_n, n


def inv_std(var: torch.Tensor, eps: float, acc: torch.dtype) -> torch.Tensor:
    """``InvStd``: 0 where var and eps are both 0, else 1 / sqrt(var + eps), added, rooted and divided in double
    (its epsilon parameter is a double holding the kernel's acc-typed epsilon), stored as acc."""
    e = float(torch.tensor(eps, dtype=acc))
    out = (1.0 / torch.sqrt(var.double() + e)).to(acc)
    return torch.where((var != 0) | (e != 0), out, torch.zeros_like(out))


def welford_contiguous(x3: torch.Tensor, acc: torch.dtype, eps: float) -> tuple:
    """``batch_norm_collect_statistics_kernel`` with ``InvStd``: (mean, invstd) per channel of [N, C, L]."""
    n_rows, c, ln = x3.shape
    tf = num_threads(ln)
    items, ok = _thread_items(x3.to(acc), max(1, MAX_BLOCK // tf), tf)
    avg = torch.zeros(items.shape[:-1], dtype=acc)
    var_n = torch.zeros_like(avg)
    n = torch.zeros(avg.shape, dtype=torch.int64)
    for k in range(items.shape[-1]):  # n++; avg += d1 / n; var_n += d1 * (v - avg)
        v, valid = items[..., k], ok[..., k]
        n = n + valid
        d1 = v - avg
        new = avg + d1 / n.to(acc)
        var_n = torch.where(valid, var_n + d1 * (v - new), var_n)
        avg = torch.where(valid, new, avg)
    state = [t.reshape(c, -1, WARP) for t in (avg, var_n, n)]  # thread id x + y * bx; warps of 32
    state = _welford_xor(*state, acc)
    warps = state[0].shape[1]
    state = [torch.cat([t[..., 0], t.new_zeros(c, WARP - warps)], 1) for t in state]  # lane 0 of each, then 0s
    avg, var_n, n = _welford_xor(*state, acc)
    count = torch.tensor(n_rows * ln, dtype=acc)  # N, an int, divided into a float
    return avg[:, 0], inv_std(var_n[:, 0] / count, eps, acc)


def _warp_down(v: torch.Tensor, narrow: Optional[torch.dtype], acc: torch.dtype) -> torch.Tensor:
    """``WarpReduce`` over the last dim: lane 0's sum after shuffle-down by 16, 8, 4, 2, 1, each shuffled partial
    rounded to ``narrow`` (``Float2``'s constructor) where given."""
    v = v.clone()
    for o in (16, 8, 4, 2, 1):
        other = v[..., o:2 * o]
        v[..., :o] = v[..., :o] + (other.to(narrow).to(acc) if narrow is not None else other)
    return v[..., 0]


def _block_reduce(v: torch.Tensor, narrow: Optional[torch.dtype], acc: torch.dtype) -> torch.Tensor:
    """``BlockReduce`` (Block2D) of [C, warps, 32] per-thread sums, in thread-id order."""
    lead = _warp_down(v, narrow, acc)
    lanes = torch.zeros(v.shape[0], WARP, dtype=acc)
    lanes[:, :lead.shape[1]] = lead
    return _warp_down(lanes, narrow, acc)


def grad_sums_contiguous(g3: torch.Tensor, x3: torch.Tensor, mean: torch.Tensor, acc: torch.dtype,
                         narrow: Optional[torch.dtype]) -> tuple:
    """``batch_norm_backward_reduce_kernel``'s (sum of g, sum of g * (x - mean)) per channel of [N, C, L].

    ``GradOp`` forms both terms in acc; ``Float2``'s constructor takes them as ``narrow`` (the input dtype where
    it is reduced, pytorch#195701) and so does every partial that crosses a warp shuffle; threads add in acc."""
    n_rows, c, ln = x3.shape
    by = min(last_pow2(n_rows), MAX_BLOCK // WARP)
    bx = min(max(num_threads(ln), WARP), MAX_BLOCK // by)
    g = g3.to(acc)
    terms = [g, g * (x3.to(acc) - mean.to(acc)[None, :, None])]
    if narrow is not None:
        terms = [t.to(narrow).to(acc) for t in terms]
    out = []
    for t in terms:
        items = _thread_items(t, by, bx)[0]
        s = torch.zeros(items.shape[:-1], dtype=acc)
        for k in range(items.shape[-1]):
            s = s + items[..., k]
        out.append(_block_reduce(s.reshape(c, -1, WARP), narrow, acc))
    return tuple(out)


# ------------------------------------------------------------------ channels-last kernels: input read as [R, C]

def _loads(rows: torch.Tensor, by: int, gy: int, acc: torch.dtype) -> tuple:
    """[R, C] -> ([C, gy, by, LOADS, loops] values, [gy, by, LOADS, loops] validity): load j of loop i of thread y
    in block row b reads row b * by + y + (i * LOADS + j) * by * gy; a load past R reads 0."""
    r = rows.shape[0]
    s = by * gy
    loops = 1 + (r - 1) // (s * LOADS) if r >= 1 else 1  # C's division truncates: (0 - 1) / k is 0
    m = (torch.arange(gy)[:, None, None, None] * by + torch.arange(by)[None, :, None, None]
         + (torch.arange(loops)[None, None, None, :] * LOADS + torch.arange(LOADS)[None, None, :, None]) * s)
    padded = torch.cat([rows.to(acc), rows.new_zeros(1, rows.shape[1], dtype=acc)])
    return padded[m.clamp(max=r)].permute(4, 0, 1, 2, 3), m < r


def _welford_merge(a: tuple, b: tuple, acc: torch.dtype) -> tuple:
    """``welford_merge_element``: (count, mean, m2n) b merged into a."""
    count, mean, m2n = a
    cn, mn, m2 = b
    factor = 1.0 / (count + cn).clamp(min=1).to(acc)
    d0 = mean - mn
    merged = (mn * cn.to(acc) + mean * count.to(acc)) * factor
    return count + cn, merged, m2n + (m2 + d0 * d0 * cn.to(acc) * count.to(acc) * factor)


def _vertical(state: tuple, merge) -> tuple:
    """A tree over threadIdx.y (last dim, a power of two): y < offset takes y + offset, offset halving to 1."""
    off = state[0].shape[-1] // 2
    while off > 0:
        state = merge(tuple(t[..., :off] for t in state), tuple(t[..., off:2 * off] for t in state))
        off //= 2
    return tuple(t[..., 0] for t in state)


def _last_block(staged: tuple, by: int, empty: tuple, merge) -> tuple:
    """The last block's pass over gy staged partials ([C, gy] each): thread y takes y, y + by, ... then the tree."""
    gy = staged[0].shape[-1]
    state = tuple(e.expand(staged[0].shape[0], by).clone() for e in empty)
    for k in range(ceil_div(gy, by)):
        take = torch.arange(by) + k * by < gy
        part = tuple(torch.cat([t, t[..., :1].expand(-1, by)], -1)[..., k * by:(k + 1) * by] for t in staged)
        new = merge(state, part)
        state = tuple(torch.where(take, n, s) for n, s in zip(new, state))
    return _vertical(state, merge)


def welford_channels_last(rows: torch.Tensor, acc: torch.dtype, eps: float) -> tuple:
    """``batch_norm_collect_statistics_channels_last_kernel`` with ``InvStd``: (mean, invstd) per channel."""
    r, c = rows.shape
    bx, by, gx, gy = flexible_launch(r, c, True)
    vals, ok = _loads(rows, by, gy, acc)
    mean = torch.zeros(vals.shape[:-1], dtype=acc)
    m2n = torch.zeros_like(mean)
    count = torch.zeros(ok.shape[:-1], dtype=torch.int64)
    for i in range(vals.shape[-1]):
        valid = ok[..., i]
        count = count + valid
        inv = torch.where(valid, 1.0 / count.to(acc), torch.zeros((), dtype=acc))
        d0 = vals[..., i] - mean
        mean = mean + d0 * inv
        m2n = m2n + d0 * (vals[..., i] - mean) * valid.to(acc)
    count = count.expand(mean.shape)

    def merge(a, b):
        return _welford_merge(a, b, acc)

    state = (count[..., 0], mean[..., 0], m2n[..., 0])
    for j in range(1, LOADS):
        state = merge(state, (count[..., j], mean[..., j], m2n[..., j]))
    state = _vertical(state, merge)  # [C, gy] each
    if gy > 1:
        zeros = (torch.zeros(1, 1, dtype=torch.int64), torch.zeros(1, 1, dtype=acc), torch.zeros(1, 1, dtype=acc))
        count, mean, m2n = _last_block(state, by, zeros, merge)
    else:
        count, mean, m2n = (t[:, 0] for t in state)
    return mean, inv_std(m2n / count.to(acc), eps, acc)


def grad_sums_channels_last(g_rows: torch.Tensor, x_rows: torch.Tensor, mean: torch.Tensor,
                            acc: torch.dtype) -> Optional[tuple]:
    """``batch_norm_backward_reduce_channels_last_kernel``'s (sum_dy, sum_dy_xmu) per channel, all in acc; None
    where the input is empty (every thread returns before writing: the outputs stay as allocated)."""
    r, c = x_rows.shape
    bx, by, gx, gy = flexible_launch(r, c, True)
    if r == 0:
        return None
    g, _ = _loads(g_rows, by, gy, acc)
    x, _ = _loads(x_rows, by, gy, acc)
    r_mean = mean.to(acc)[:, None, None, None]
    sdy = torch.zeros(g.shape[:-1], dtype=acc)
    sxmu = torch.zeros_like(sdy)
    for i in range(g.shape[-1]):
        sdy = sdy + g[..., i]
        sxmu = sxmu + g[..., i] * (x[..., i] - r_mean)
    sums = []
    for s in (sdy, sxmu):
        t = s[..., 0]
        for j in range(1, LOADS):
            t = t + s[..., j]
        sums.append(t)

    def add(a, b):
        return tuple(p + q for p, q in zip(a, b))

    state = _vertical(tuple(sums), add)
    if gy > 1:
        zero = torch.zeros(1, 1, dtype=acc)
        return _last_block(state, by, (zero, zero), add)
    return tuple(t[:, 0] for t in state)
