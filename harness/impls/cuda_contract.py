"""What torch's CUDA kernels of the five SyncBN ATen ops accept, as data: the cpu-emulation's conformance oracle.

Design note. Our CPU stand-ins for ``batch_norm_stats``,
``batch_norm_gather_stats_with_counts``, ``batch_norm_elemt``,
``batch_norm_backward_reduce`` and ``batch_norm_backward_elemt`` convert
whatever dtypes they are given (:mod:`~harness.impls.cuda_arith`), so alone they accept
more than CUDA does, and a torch verdict made in cpu-emulation can be false (a
float32 mean read as float64 by the gather: training "passes" on CPU and
raises on a GPU). :func:`verdict` answers, for one call of one op with its
arguments (tensors or None), whether CUDA's kernel accepts it, the dtypes of
what it returns, and otherwise the exception type and message it raises. The
emulated kernels ask :func:`verdict` first (:mod:`harness.impls.torch_emulation`),
and :mod:`harness.impls.cuda_plan` asks it of the calls torch's SyncBN makes for
a case, planned before the case runs.

Each op is modelled as its CUDA code runs: the dtype it dispatches on (float64,
float32, float16 or bfloat16, else ``NotImplementedError`` naming the dispatch),
then its typed reads in order: a packed accessor raises ``RuntimeError("Expected
<arg> to have type <T> but got <U>")``, a raw pointer ``RuntimeError("expected
scalar type <T> but found <U>")``. The layout picks the code path, each with its
own rules (:func:`elementwise_path`, :func:`channels_last_kernels`). The raw
pointers of one launch are read in an order C++ leaves open: the first wrong in
argument order is reported, the others kept as ``alternatives``. ``acc(T)`` is
float for float16, bfloat16 and float32; float64 for float64.

Read from (facts in our words, no torch text): ``Normalization.cuh`` as shipped
in the torch 2.13.0 wheel (commit cf30153c4c13), ``Normalization.cu`` at
pytorch/pytorch@181624244c76 (before 2.3) and at cyyever/pytorch@0d188885a9a2
(a fork of 2026 main), the same in their dtype logic; 2.13's own ``.cu`` could
not be fetched. Not modelled, as not verified for 2.13: the shape checks of
pytorch#190005 (gather, in that fork) and pytorch#189152 (backward_reduce); the
reference kernels check shapes themselves. The table:
docs/catalog-and-judgement.md, "torch on CPU".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

import torch

FLOATING = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
INT32_MAX = 2 ** 31 - 1
C10_NAMES = {torch.float64: "Double", torch.float32: "Float", torch.float16: "Half", torch.bfloat16: "BFloat16",
             torch.int32: "Int", torch.int64: "Long", torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte",
             torch.bool: "Bool", torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble"}
READ_FROM = ("Normalization.cuh of the torch 2.13.0 wheel (cf30153c4c13); Normalization.cu at "
             "pytorch/pytorch@181624244c76 and cyyever/pytorch@0d188885a9a2")


def c10_name(dtype: torch.dtype) -> str:
    """The dtype as c10 prints it in error messages (``Float``, ``Half``, ``BFloat16``...)."""
    return C10_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def acc(dtype: torch.dtype) -> torch.dtype:
    """CUDA's accumulation type: float for float16, bfloat16 and float32; float64 for float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


@dataclass(frozen=True)
class Refusal:
    """How CUDA's kernel refuses a call: the exception it raises and the argument that caused it."""

    op: str
    argument: str
    exc_type: type
    message: str
    alternatives: tuple = ()  # other messages CUDA may raise first (argument order of one launch is open)

    def exception(self) -> BaseException:
        """The exception CUDA raises, to raise in its place."""
        return self.exc_type(self.message)

    def __str__(self) -> str:
        return f"aten::{self.op}: {self.exc_type.__name__}: {self.message}"


@dataclass(frozen=True)
class Verdict:
    """One call judged: ``refusal`` (None: accepted), else the dtypes CUDA returns (None for an undefined output)."""

    op: str
    path: str
    refusal: Optional[Refusal] = None
    outputs: tuple = ()


class _Refused(Exception):
    """Internal: carries the first refusal out of an op's model."""

    def __init__(self, refusal: Refusal):
        super().__init__(str(refusal))
        self.refusal = refusal


def _dispatch(op: str, name: str, dtype: torch.dtype) -> None:
    """A dispatch over the four floating dtypes, under ``name``."""
    if dtype not in FLOATING:
        message = f"\"{name}\" not implemented for '{c10_name(dtype)}'"
        raise _Refused(Refusal(op, "dispatch", NotImplementedError, message))


def _accessor(op: str, label: str, t: Optional[torch.Tensor], want: torch.dtype, dims: Optional[int]) -> None:
    """A packed accessor of ``dims`` dims over ``t`` typed ``want`` (an undefined ``t`` gets a dummy).

    ``dims`` None: the kernel reads a reshaped view whose dims always match (input, grad_out as [N, C, -1]).
    """
    if t is None:
        return
    if t.dtype != want:
        raise _Refused(Refusal(op, label, RuntimeError,
                               f"Expected {label} to have type {c10_name(want)} but got {c10_name(t.dtype)}"))
    if dims is not None and t.dim() != dims:
        raise _Refused(Refusal(op, label, RuntimeError,
                               f"TensorAccessor expected {dims} dims but tensor has {t.dim()}"))


def _pointers(op: str, reads: list) -> None:
    """Raw typed pointers read as the arguments of one launch: ``(label, tensor or None, dtype)`` each."""
    wrong = [(label, f"expected scalar type {c10_name(want)} but found {c10_name(t.dtype)}")
             for label, t, want in reads if t is not None and t.dtype != want]
    if wrong:
        others = tuple(m for m in dict.fromkeys(m for _, m in wrong) if m != wrong[0][1])
        raise _Refused(Refusal(op, wrong[0][0], RuntimeError, wrong[0][1], others))


def fits_int32_indexing(t: torch.Tensor) -> bool:
    """Whether CUDA indexes ``t`` with 32-bit math (fewer elements and a largest offset below 2**31 - 1)."""
    if t.numel() >= INT32_MAX:
        return False
    return sum((s - 1) * st for s, st in zip(t.shape, t.stride()) if s > 0) < INT32_MAX


def channels_last_kernels(t: torch.Tensor) -> bool:
    """Whether the reductions and backward_elemt take their channels-last kernels for ``t``."""
    return (t.is_contiguous(memory_format=torch.channels_last) if t.dim() == 4 else False) or \
        (t.is_contiguous(memory_format=torch.channels_last_3d) if t.dim() == 5 else False) or \
        (t.is_contiguous() and t.dim() > 1 and t.stride(1) == 1)


def elementwise_path(t: torch.Tensor) -> str:
    """batch_norm_elemt's path for input ``t``: ``contiguous``, ``channels_last`` or ``general``.

    channels_last_3d input is not among the channels-last cases here (it takes the general path).
    """
    if not fits_int32_indexing(t):
        return "general"
    if t.is_contiguous():
        return "channels_last" if t.dim() > 1 and t.stride(1) == 1 else "contiguous"
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
        return "channels_last"
    return "general"


def _stats(op: str, a: Mapping) -> tuple:
    x = a["input"]
    _dispatch(op, "batch_norm_stats_cuda", x.dtype)
    return "channels_last" if channels_last_kernels(x) else "contiguous", (acc(x.dtype), acc(x.dtype))


def _gather(op: str, a: Mapping) -> tuple:
    rm, rv = a.get("running_mean"), a.get("running_var")
    d = rm.dtype if rm is not None else a["input"].dtype  # the running statistics' dtype, else the input's
    _dispatch(op, "batch_norm_update_stats_cuda", d)
    _accessor(op, "mean", a["mean"], acc(d), 2)
    _accessor(op, "invstd", a["invstd"], acc(d), 2)
    _accessor(op, "running_mean", rm, d, 1)
    _accessor(op, "running_mean", rv, d, 1)  # sic: CUDA names running_var "running_mean" in this message
    _accessor(op, "counts", a["counts"], d, 1)
    return "dispatch on running_mean", (acc(a["mean"].dtype),) * 2


def _first_param_dtype(*params) -> Optional[torch.dtype]:
    return next((p.dtype for p in params if p is not None), None)


def _elemt(op: str, a: Mapping) -> tuple:
    x, w, b, mean, invstd = a["input"], a.get("weight"), a.get("bias"), a["mean"], a["invstd"]
    path = elementwise_path(x)
    one_d = [t for t in (w, b, mean, invstd) if t is not None]
    if path == "channels_last" and not all(t.is_contiguous() for t in one_d):
        path = "general"
    if path == "general":  # a TensorIterator that casts every operand: any floating dtypes
        _dispatch(op, "batch_norm_elementwise_cuda", x.dtype)
        return path, (x.dtype,)
    ax = acc(x.dtype)
    if path == "contiguous":
        _dispatch(op, "batch_norm_elementwise_cuda", x.dtype)
        first = _first_param_dtype(w, b)
        stat = ax if first is not None and first != x.dtype else x.dtype  # mixed: parameters read as acc(input)
        for label, t, want in (("weight", w, stat), ("bias", b, stat), ("mean", mean, ax), ("invstd", invstd, ax)):
            _accessor(op, label, t, want, 1)
        return path, (x.dtype,)
    _dispatch(op, "batchnorm_forward", x.dtype)
    param = ax if (_first_param_dtype(w, b) or x.dtype) != x.dtype else x.dtype
    _pointers(op, [("mean", mean, ax), ("invstd", invstd, ax), ("weight", w, param), ("bias", b, param)])
    return path, (x.dtype,)


def _backward_reduce(op: str, a: Mapping) -> tuple:
    g, x, mean, invstd, w = a["grad_out"], a["input"], a["mean"], a["invstd"], a.get("weight")
    flags = (bool(a.get("input_g")), bool(a.get("weight_g")), bool(a.get("bias_g")))
    if (fits_int32_indexing(g) and channels_last_kernels(g) and channels_last_kernels(x)
            and (w is None or w.is_contiguous()) and mean.is_contiguous() and invstd.is_contiguous()):
        _dispatch(op, "batchnorm_backward_reduce", x.dtype)
        ax = acc(x.dtype)
        param = ax if w is not None and w.dtype != x.dtype else x.dtype
        # sum_dy and sum_dy_xmu are made like mean, grad_weight and grad_bias like weight: read back typed
        _pointers(op, [("grad_output", g, x.dtype), ("mean", mean, ax), ("invstd", invstd, ax),
                       ("grad_weight", w, param), ("grad_bias", w, param)])
        wdt = w.dtype if w is not None else mean.dtype  # without weight: empty tensors like mean
        return "channels_last", (mean.dtype, mean.dtype, wdt, wdt)
    _dispatch(op, "batch_norm_backward_reduce", g.dtype)
    if mean.dtype != invstd.dtype:
        raise _Refused(Refusal(op, "invstd", RuntimeError, "mean and invstd need to have the same data types"))
    stat = acc(g.dtype) if w is not None and w.dtype != x.dtype else g.dtype
    _accessor(op, "input", x, g.dtype, None)
    _accessor(op, "grad_weight", w if flags[1] else None, stat, 1)
    _accessor(op, "grad_bias", w if flags[2] else None, stat, 1)
    _accessor(op, "mean", mean, acc(stat), 1)
    _accessor(op, "invstd", invstd, acc(stat), 1)
    wdt = w.dtype if w is not None else None
    return "contiguous", (mean.dtype if flags[0] else None, mean.dtype if flags[0] else None,
                          wdt if flags[1] else None, wdt if flags[2] else None)


def _backward_elemt(op: str, a: Mapping) -> tuple:
    g, x, mean, invstd, w = a["grad_out"], a["input"], a["mean"], a["invstd"], a.get("weight")
    sums = (("sum_dy", a["sum_dy"]), ("sum_dy_xmu", a["sum_dy_xmu"]))
    if fits_int32_indexing(g) and channels_last_kernels(g) and channels_last_kernels(x):
        _dispatch(op, "batchnorm_backward_element", x.dtype)
        ax = acc(x.dtype)
        param = ax if w is not None and w.dtype != x.dtype else x.dtype
        _pointers(op, [("grad_output", g, x.dtype), ("mean", mean, ax), ("invstd", invstd, ax), ("weight", w, param),
                       *[(label, t, ax) for label, t in sums], ("count", a["count"], torch.int32)])
        return "channels_last", (x.dtype,)
    _dispatch(op, "batch_norm_backward_elemt", g.dtype)
    if mean.dtype != invstd.dtype:
        raise _Refused(Refusal(op, "invstd", RuntimeError, "mean and invstd need to have the same data types"))
    reduced_with_float = g.dtype in (torch.float16, torch.bfloat16) and mean.dtype == torch.float32
    stat = torch.float32 if reduced_with_float else g.dtype
    _accessor(op, "input", x, g.dtype, None)
    for label, t, want in (("mean", mean, acc(stat)), ("invstd", invstd, acc(stat)), ("weight", w, stat),
                           *[(label, t, acc(stat)) for label, t in sums]):
        _accessor(op, label, t, want, 1)
    _pointers(op, [("count", a["count"], torch.int32)])
    return "contiguous", (g.dtype,)


_MODELS = {"batch_norm_stats": _stats, "batch_norm_gather_stats_with_counts": _gather, "batch_norm_elemt": _elemt,
           "batch_norm_backward_reduce": _backward_reduce, "batch_norm_backward_elemt": _backward_elemt}
OPS = tuple(_MODELS)


def verdict(op: str, args: Mapping) -> Verdict:
    """Whether CUDA's kernel of ``aten::<op>`` accepts ``args`` (argument name -> tensor, None or scalar).

    Raises KeyError naming the op if it is not one of :data:`OPS`.
    """
    if op not in _MODELS:
        raise KeyError(f"no CUDA contract for aten::{op}: known ops are {', '.join(OPS)}")
    try:
        path, outputs = _MODELS[op](op, args)
    except _Refused as r:
        return Verdict(op, "refused", r.refusal)
    return Verdict(op, path, None, outputs)


def check(op: str, args: Mapping) -> Optional[Refusal]:
    """CUDA's refusal of this call, or None where CUDA accepts it."""
    return verdict(op, args).refusal


def enforce(op: str, args: Mapping) -> None:
    """Raise what CUDA raises for this call (same exception type and message); return where CUDA accepts it."""
    refusal = check(op, args)
    if refusal is not None:
        raise refusal.exception()
