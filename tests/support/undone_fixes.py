"""torch's SyncBatchNorm with one upstream fix undone, as harness plugins: what cpu-emulation must catch.

- :class:`EmptyBranchUndone`: pytorch#74944's empty-input branch undone. Its forward calls ``batch_norm_stats``
  and ``batch_norm_elemt`` whatever the input, as before that PR (every ``if input.numel() > 0:`` of the forward
  taken as true). On CUDA the stats' contiguous kernel cannot reshape an empty input, and a channels-last launch
  over it is refused.
- :class:`ZeroCountMaskUndone`: the mask that drops zero-count rows before the gather undone (as under CUDA-graph
  capture, pytorch#78656): an empty rank's zero row reaches ``batch_norm_gather_stats_with_counts``, whose CUDA
  loop merges it (1 / invstd = inf, times count 0: NaN).

And one fix done ahead of its release: :class:`Float2Widened`, torch's own module and Function over the kernels
of a release that holds pytorch#196125 (taken to be 2.15): ``batch_norm_backward_reduce``'s contiguous kernel no
longer rounds its partial sums to half input's dtype (pytorch#195701), so scaled gradients no longer overflow.

Each is the installed torch's own ``torch.nn.modules._functions.SyncBatchNorm.forward``, recompiled from its
source with one change to the syntax tree (nothing of torch's is copied here; the change fails loudly if the
source no longer has the statement), in a subclass of torch's Function, driven by torch's module bookkeeping
(:class:`_Undone`). The five ops' CPU kernels are those of :mod:`harness.impls.torch_emulation` of the checkout
that runs, installed when a rank builds the layer (never in the parent, which only imports this file).

Run: ``PYTHONPATH=tests/support python -m harness run --impl undone_fixes:EmptyBranchUndone --case ...``.
"""

from __future__ import annotations

import ast
import inspect
import textwrap

import torch
from torch.nn.modules import _functions

from harness.impls import cuda_arith, torch_emulation


class _IfTestIs(ast.NodeTransformer):
    """Replaces the test of every ``if`` whose source contains ``needle`` by the constant ``value``."""

    def __init__(self, needle: str, value: bool):
        self.needle, self.value, self.replaced = needle, value, 0

    def visit_If(self, node: ast.If):
        self.generic_visit(node)
        if self.needle in ast.unparse(node.test):
            self.replaced += 1
            node.test = ast.copy_location(ast.Constant(self.value), node.test)
        return node


def patched_function(name: str, needle: str, value: bool, expected: int):
    """A subclass of torch's SyncBatchNorm Function whose forward is torch's with ``expected`` if-tests replaced."""
    original = _functions.SyncBatchNorm.forward
    tree = ast.parse(textwrap.dedent(inspect.getsource(original)))
    change = _IfTestIs(needle, value)
    tree = ast.fix_missing_locations(change.visit(tree))
    if change.replaced != expected:
        raise RuntimeError(f"torch {torch.__version__}'s SyncBatchNorm Function forward has {change.replaced} "
                           f"'if' tests with {needle!r}, not {expected}: this patch was written for 2.13")
    ast.increment_lineno(tree, original.__code__.co_firstlineno - 1)
    namespace: dict = {}
    exec(compile(tree, original.__code__.co_filename, "exec"), vars(_functions), namespace)  # noqa: S102
    return type(name, (_functions.SyncBatchNorm,), {"forward": namespace["forward"]})


class _Undone(torch.nn.SyncBatchNorm):
    """torch's module with its bookkeeping repeated (as :class:`~harness.impls.torch_emulation.FunctionDriven`,
    written here again so that the same file runs over an older checkout of the harness) around ``function``."""

    capabilities = {"convert": False, "devices": ["cpu"]}
    function = _functions.SyncBatchNorm

    def __init__(self, *args, **kwargs):
        torch_emulation.install()  # in the rank that builds the layer: the five ops' CPU kernels
        super().__init__(*args, **kwargs)

    def forward(self, input):
        import torch.distributed as dist
        import torch.nn.functional as F

        self._check_input_dim(input)
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
        return self.function.apply(input, self.weight, self.bias, running_mean, running_var, self.eps, factor, group,
                                   world_size)


class EmptyBranchUndone(_Undone):
    """pytorch#74944's empty-input branch undone: batch_norm_stats and batch_norm_elemt run on an empty input."""

    name = "torch-74944-empty-branch-undone"
    function = patched_function("EmptyBranchUndoneFunction", "input.numel() > 0", True, 2)


class ZeroCountMaskUndone(_Undone):
    """The zero-count mask (pytorch#78656's eager path) undone: empty ranks' zero rows reach the gather."""

    name = "torch-78656-zero-count-mask-undone"
    function = patched_function("ZeroCountMaskUndoneFunction", "is_current_stream_capturing", False, 1)


class Float2Widened(_Undone):
    """torch 2.13's SyncBatchNorm over the kernels of a release with pytorch#196125: the contiguous
    ``batch_norm_backward_reduce`` keeps its partial sums in float (``cuda_arith.FLOAT2_WIDENED`` moved back to
    this release, in the rank that builds the layer; run it alone in a pool: the rank keeps the change)."""

    name = "torch-196125-float2-widened"

    def __init__(self, *args, **kwargs):
        cuda_arith.FLOAT2_WIDENED = (0, 0)
        super().__init__(*args, **kwargs)
