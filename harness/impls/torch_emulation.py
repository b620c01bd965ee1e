"""CPU emulation of ``torch.nn.SyncBatchNorm``: torch's own Python code over CPU kernels doing CUDA's arithmetic.

Upstream refuses CPU input, and the five ATen ops its autograd Function calls
have CUDA kernels only. In rank processes (never in the parent), :func:`install`
registers CPU kernels for exactly those ATen ops, through ``torch.library``, so
that torch's module and Function run on CPU over gloo.

What is torch's (under test): ``torch.nn.SyncBatchNorm.forward`` (input
checks, num_batches_tracked, the momentum or cumulative factor, the decision
to synchronize, process group and world size) and
``torch.nn.modules._functions.SyncBatchNorm`` (channels-last handling, each
rank's count, the zero row of an empty rank, the all_gather of (mean, invstd,
count), dropping empty ranks, the cast of counts to the running statistics'
dtype, what is saved for backward, the backward all_reduce of (sum_dy,
sum_dy_xmu), the int32 count tensor, the weight cast), and gloo itself.

What is ours: the arithmetic of the five ATen ops, transliterated from their
CUDA kernels (:mod:`harness.impls.cuda_arith`): the same code path for a
layout, the same dtype for every sum and count, the merge of gathered rows
over every row (count 0 included), the reductions' partials in CUDA's order,
CUDA's answer to an empty input (a reshape that raises, a launch refused,
``(0, NaN)``). So a torch defect that CUDA's arithmetic exposes shows here too,
and a difference from a GPU is ours (a few roundings, where nvcc fuses a
multiply-add; ``cuda`` tests compare op by op). Before any arithmetic, each
emulated op refuses what CUDA's kernel refuses, raising CUDA's exception with
CUDA's message (:mod:`harness.impls.cuda_contract`).

The module's device check: releases whose check consults
``torch._C._get_privateuse1_backend_name()`` run torch's own ``forward``
with that one call answered ``"cpu"`` in its source
(:func:`accept_cpu_in_module`: the function is recompiled from torch's source
with the call replaced by the constant, same file and line numbers), installed
on the class in rank processes: the "module" path. Nothing else in the process
sees the answer, so FakeTensor, dynamo and inductor, which ask the same lookup
for their own purposes, still see ``privateuseone``; and ``torch.compile``
traces the same function it would on a GPU, where the lookup is
constant-folded too (:func:`as_shipped` puts torch's own back for a block:
inference judged as shipped). Releases whose check reads ``input.is_cuda`` get
:class:`FunctionDriven`, which repeats the module's bookkeeping and calls
torch's autograd Function directly: the "function" path.
``SYNCBN_HARNESS_TORCH_PATH=module|function`` forces one. Seen: torch 2.13
and 2.1 take the module path, 1.13 the function path; both paths run on 2.13.
Torch's Function also asks ``torch.cuda.is_current_stream_capturing()`` (a
CUDA build without a driver raises there, torch 1.13); with no CUDA device it
is answered ``False`` in rank processes, the answer a GPU outside graph
capture gives, by a function installed under the same names before dynamo
first reads its rules, so dynamo treats it by torch's rule for that name.

A build that cannot be emulated (no ``torch.library.Library``, an ATen op
missing) is reported by
:func:`unavailable_reason`, and :func:`install` raises
:class:`~harness.errors.ImplUnavailable` with that reason rather than failing
inside torch.

Op schemas are read from the installed build, not assumed: arguments are
matched by name, an ``int[]`` counts argument becomes a tensor, and releases
whose ``batch_norm_backward_elemt`` has no ``count`` argument get per-rank
means from ``batch_norm_backward_reduce`` (their contract then) instead of sums.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import textwrap
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.modules._functions import SyncBatchNorm as SyncBNFunction

from harness.catalog.case import PRIVATE_OPS
from harness.impls import cuda_arith, cuda_contract, cuda_reduce
from harness.errors import ImplUnavailable
from harness.paths import TORCH_PATH, setting

OPS = PRIVATE_OPS  # the five ATen ops emulated (their names are spelled in the catalog)
_library = None


def installed_schema(op: str):
    """The installed build's schema of ``aten::<op>`` (its default overload)."""
    schemas = torch._C._jit_get_schemas_for_operator(f"aten::{op}")
    for s in schemas:
        if s.overload_name == "":
            return s
    raise RuntimeError(f"this torch build has no aten::{op}; cannot emulate SyncBatchNorm on CPU")


def arg_names(op: str) -> list[str]:
    """Argument names of the installed ``aten::<op>``, in order."""
    return [a.name for a in installed_schema(op).arguments]


def backward_takes_counts() -> bool:
    """Whether backward_elemt divides by the global count itself (sums), or takes means."""
    return "count" in arg_names("batch_norm_backward_elemt")


# The argument names the CUDA contract was read for; an installed schema without them is an older contract
# (batch_norm_backward_elemt with means instead of sums and no count; likewise a gather taking int[] counts),
# which the emulation leaves unchecked.
CONTRACT_ARGS = {"batch_norm_backward_elemt": ("sum_dy", "sum_dy_xmu", "count")}


def conforms(op: str, names: list[str]) -> bool:
    """Whether the emulated ``op`` enforces :mod:`~harness.impls.cuda_contract` (its schema is the one read)."""
    return set(CONTRACT_ARGS.get(op, ())) <= set(names)


def _kernel(op: str):
    names = arg_names(op)
    sums = backward_takes_counts()
    conform = conforms(op, names)

    def call(*args, **kwargs):
        a = dict(zip(names, args))
        a.update(kwargs)
        listed = op == "batch_norm_gather_stats_with_counts" and not isinstance(a["counts"], torch.Tensor)
        if listed:  # an int[] schema, whose CUDA kernel made the tensor itself: not the contract read
            a["counts"] = torch.tensor(list(a["counts"]), dtype=a["mean"].dtype)
        verdict = cuda_contract.verdict(op, a) if conform and not listed else None
        if verdict is not None and verdict.refusal is not None:
            raise verdict.refusal.exception()  # what CUDA raises for a combination its kernel refuses
        if op == "batch_norm_gather_stats_with_counts":
            return cuda_arith.batch_norm_gather_stats_with_counts(
                a["input"], a["mean"], a["invstd"], a["running_mean"], a["running_var"], a["momentum"], a["eps"],
                a["counts"])
        if op == "batch_norm_backward_reduce":
            return _backward_reduce(a, sums)
        if op == "batch_norm_backward_elemt":
            s = a.get("sum_dy", a.get("mean_dy"))
            sx = a.get("sum_dy_xmu", a.get("mean_dy_xmu"))
            count = a["count"] if sums else torch.ones(1, dtype=torch.int32)  # means: divided by 1
            return cuda_arith.batch_norm_backward_elemt(a["grad_out"], a["input"], a["mean"], a["invstd"],
                                                        a.get("weight"), s, sx, count)
        if op == "batch_norm_elemt":
            return cuda_arith.batch_norm_elemt(a["input"], a.get("weight"), a.get("bias"), a["mean"], a["invstd"])
        return cuda_arith.batch_norm_stats(a["input"], a["eps"])

    call.__name__ = f"syncbn_emulated_cpu_{op}"
    return call


def _backward_reduce(a: dict, sums: bool) -> tuple:
    """CUDA's backward_reduce; releases whose backward_elemt takes means get the sums divided by the local count."""
    out = cuda_arith.batch_norm_backward_reduce(a["grad_out"], a["input"], a["mean"], a["invstd"], a.get("weight"),
                                                a["input_g"], a["weight_g"], a["bias_g"])
    if sums or out[0] is None:
        return out
    n = max(a["input"].numel() // a["input"].shape[1], 1)
    return (out[0] / n, out[1] / n, out[2], out[3])


def hide_kernels_from_dynamo() -> None:
    """Dynamo runs the Python CPU kernels as they are instead of compiling their frames, or the frames they call.

    After a graph break the ops run eagerly, and dynamo's frame hook would compile the Python function the
    dispatcher calls and the contract check it makes (graphs and recompiles a GPU, whose kernels are C++, never
    has). No effect on tracing: there the ops meet FakeTensors, never these kernels.
    """
    from torch._dynamo import eval_frame

    code = _kernel("batch_norm_stats").__code__  # every op's kernel shares this code object
    try:  # torch >= 2.6: skip the kernel and everything it calls
        from torch._dynamo.types import FrameAction, FrameExecStrategy

        eval_frame.set_code_exec_strategy(code, FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP))
        return
    except (ImportError, AttributeError):
        pass  # older: skip each of our code objects the kernel runs
    skip_code = getattr(eval_frame, "skip_code", None)  # torch >= 2.1
    if skip_code is not None:
        for c in (code, *(c for m in (cuda_contract, cuda_arith, cuda_reduce) for c in _code_objects(m))):
            skip_code(c)


def _code_objects(module):
    """The code objects of ``module``'s own functions and methods, nested ones (comprehensions) included.

    Its own: written in its file, or generated for its classes (dataclass methods), not shared wrappers."""
    def nested(c):
        yield c
        for const in c.co_consts:
            if inspect.iscode(const):
                yield from nested(const)

    for value in vars(module).values():
        members = vars(value).values() if inspect.isclass(value) else (value,)
        for f in members:
            if (inspect.isfunction(f) and f.__module__ == module.__name__
                    and f.__code__.co_filename in (module.__file__, "<string>")):
                yield from nested(f.__code__)


def unavailable_reason() -> Optional[str]:
    """Why the CPU emulation cannot run with this torch build (None if it can), naming the fix.

    Checks what :func:`install` needs: ``torch.library.Library`` with ``IMPL``
    registrations and the five ATen ops in the installed build. The arithmetic
    is Python over torch (:mod:`harness.impls.cuda_arith`): nothing is built.
    """
    if not hasattr(torch, "library") or not hasattr(torch.library, "Library"):
        return (f"torch {torch.__version__} has no torch.library.Library, needed to register CPU kernels "
                "for the five ATen ops: use torch >= 1.13, or run the torch impl on --device cuda")
    for op in OPS:
        try:
            installed_schema(op)
        except RuntimeError as exc:
            return str(exc)
    return None


def install() -> None:
    """Register CUDA's arithmetic (:mod:`harness.impls.cuda_arith`) as the CPU kernels of the five ATen ops (once
    per process).

    Only ever called in rank processes. Raises :class:`ImplUnavailable` with the
    reason if this build cannot be emulated (see :func:`unavailable_reason`).
    Where no CUDA device is usable (always, when emulating), torch's
    ``torch.cuda.is_current_stream_capturing()`` is answered ``False`` in this
    process: torch's Function asks it before dropping empty ranks' rows, and
    CUDA builds without a driver (torch < 2) raise there instead.
    """
    global _library
    if _library is not None:
        return
    reason = unavailable_reason()
    if reason:
        raise ImplUnavailable(f"torch cpu-emulation unavailable: {reason}")
    lib = torch.library.Library("aten", "IMPL")
    for op in OPS:
        lib.impl(op, _kernel(op), "CPU")
    if not torch.cuda.is_available():
        _not_capturing()
    _library = lib  # the registrations live as long as this object


def _not_capturing() -> None:
    """``torch.cuda.is_current_stream_capturing()`` answers ``False`` (no CUDA stream exists here)."""
    def is_current_stream_capturing() -> bool:
        return False

    torch.cuda.is_current_stream_capturing = is_current_stream_capturing
    graphs = getattr(torch.cuda, "graphs", None)
    if graphs is not None and hasattr(graphs, "is_current_stream_capturing"):
        graphs.is_current_stream_capturing = is_current_stream_capturing


def device_check_path(cls=None) -> str:
    """``"module"`` if the unmodified module (``cls``, default torch's SyncBatchNorm) can be run on CPU here, else
    ``"function"``."""
    forced = setting(TORCH_PATH)
    if forced in ("module", "function"):
        return forced
    try:
        src = inspect.getsource((cls or torch.nn.SyncBatchNorm).forward)
    except (OSError, TypeError):
        return "function"
    return "module" if "_get_privateuse1_backend_name" in src else "function"


def accept_cpu_in_module(cls=None) -> None:
    """Install on ``cls`` (default ``torch.nn.SyncBatchNorm``; a patched copy of it for ``torch@PATH``) its own
    ``forward`` with the privateuse1 lookup answered ``"cpu"``.

    The function is torch's source with every ``torch._C._get_privateuse1_backend_name()`` call replaced by
    the constant ``"cpu"``, compiled under torch's file name and line numbers with torch's globals. Only rank
    processes call this (once; later calls do nothing). Raises :class:`ImplUnavailable` if the source has no
    such call or cannot be read, naming the other path.
    """
    cls = cls or torch.nn.SyncBatchNorm
    if getattr(cls.forward, "_syncbn_harness_accepts_cpu", False):
        return
    original = cls.forward
    fix = ("set SYNCBN_HARNESS_TORCH_PATH=function to drive torch's Function directly, or run the torch impl "
           "on --device cuda")
    try:
        source = textwrap.dedent(inspect.getsource(original))
    except (OSError, TypeError) as exc:
        raise ImplUnavailable(f"cannot read torch {torch.__version__}'s SyncBatchNorm.forward ({exc}): {fix}") \
            from None
    if original.__code__.co_freevars:
        raise ImplUnavailable(f"torch {torch.__version__}'s SyncBatchNorm.forward uses closure variables "
                              f"{original.__code__.co_freevars}: {fix}")
    tree = ast.parse(source)
    answered = _AnswerCpu()
    tree = ast.fix_missing_locations(answered.visit(tree))
    if not answered.replaced:
        raise ImplUnavailable(f"torch {torch.__version__}'s SyncBatchNorm.forward does not ask "
                              f"torch._C._get_privateuse1_backend_name(): {fix}")
    ast.increment_lineno(tree, original.__code__.co_firstlineno - 1)
    namespace: dict = {}
    exec(compile(tree, original.__code__.co_filename, "exec"), original.__globals__, namespace)  # noqa: S102
    forward = namespace[original.__name__]
    forward.__qualname__, forward.__module__, forward.__doc__ = (original.__qualname__, original.__module__,
                                                                 original.__doc__)
    forward._syncbn_harness_accepts_cpu = True
    forward._syncbn_harness_shipped = original  # what :func:`as_shipped` puts back for a block
    cls.forward = forward


@contextlib.contextmanager
def as_shipped(cls, model):
    """For the block, ``model``'s layers of ``cls`` (torch's SyncBatchNorm, or a patched copy) run torch's code as
    shipped: ``cls.forward`` is torch's own again (:func:`accept_cpu_in_module` undone, so nothing answers its
    device check), and layers of :class:`FunctionDriven` (the function path) are of ``cls`` again. Both come back
    after the block. The five ops' CPU kernels stay registered: an evaluation never calls them."""
    patched = cls.__dict__.get("forward")
    original = getattr(patched, "_syncbn_harness_shipped", None)
    driven = [m for m in model.modules() if type(m) is FunctionDriven]
    if original is not None:
        cls.forward = original
    for m in driven:
        m.__class__ = cls
    try:
        yield
    finally:
        for m in driven:
            m.__class__ = FunctionDriven
        if original is not None:
            cls.forward = patched


class _AnswerCpu(ast.NodeTransformer):
    """Replaces ``torch._C._get_privateuse1_backend_name()`` calls by the constant ``"cpu"``."""

    replaced = 0

    def visit_Call(self, node: ast.Call):
        self.generic_visit(node)
        f = node.func
        if (isinstance(f, ast.Attribute) and f.attr == "_get_privateuse1_backend_name"
                and isinstance(f.value, ast.Attribute) and f.value.attr == "_C"
                and isinstance(f.value.value, ast.Name) and f.value.value.id == "torch" and not node.args):
            self.replaced += 1
            return ast.copy_location(ast.Constant("cpu"), node)
        return node


class FunctionDriven(torch.nn.SyncBatchNorm):
    """torch's SyncBatchNorm whose forward repeats the module's bookkeeping and calls torch's Function.

    Used only on releases whose device check reads ``input.is_cuda``: everything
    below the check (the Function, its forward and backward) is torch's code.
    """

    def forward(self, input):
        # The imports are the module's: TorchScript refuses an import statement, and scripting this forward
        # must fail (or not) as torch's own does.
        self._check_input_dim(input)
        if hasattr(self, "_check_non_zero_input_channels"):
            self._check_non_zero_input_channels(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / self.num_batches_tracked.item() if self.momentum is None else self.momentum
        bn_training = self.training or (self.running_mean is None and self.running_var is None)
        running_mean = self.running_mean if not self.training or self.track_running_stats else None
        running_var = self.running_var if not self.training or self.track_running_stats else None
        need_sync = bn_training and self.training and dist.is_available() and dist.is_initialized()
        if need_sync:
            group = self.process_group or dist.group.WORLD
            world_size = dist.get_world_size(group)
            need_sync = world_size > 1
        if not need_sync:
            return F.batch_norm(input, running_mean, running_var, self.weight, self.bias, bn_training, factor,
                                self.eps)
        return SyncBNFunction.apply(input, self.weight, self.bias, running_mean, running_var, self.eps, factor,
                                    group, world_size)


DDP_CHECK_TEXT = "SyncBatchNorm layers only work with GPU modules"


@contextlib.contextmanager
def ddp_accepts_cpu_syncbn():
    """While DDP wraps a model, its refusal of ``torch.nn.SyncBatchNorm`` layers in CPU modules is skipped.

    ``DistributedDataParallel._passing_sync_batchnorm_handle`` raises for any
    SyncBatchNorm in a CPU module; in cpu-emulation the layers run on CPU on
    purpose. Only that method is replaced, only for the block, and only if its
    source is the check it is known to be (anything else is left to raise).
    Everything else DDP does (init sync, reducer, buffer broadcast) is real.
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    original = DDP.__dict__.get("_passing_sync_batchnorm_handle")
    if original is None:
        yield
        return
    try:
        source = inspect.getsource(original)
    except (OSError, TypeError):
        source = ""
    if DDP_CHECK_TEXT not in source:
        raise ImplUnavailable(f"torch {torch.__version__}'s DistributedDataParallel checks SyncBatchNorm in a way "
                              "the cpu-emulation does not know; run DDP cases with --device cuda")
    DDP._passing_sync_batchnorm_handle = lambda self, module: None
    try:
        yield
    finally:
        DDP._passing_sync_batchnorm_handle = original
