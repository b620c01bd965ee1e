"""Planted defects: SyncBNs that are wrong in one way each, as real implementations have been.

Each class changes one hook of a correct implementation (textbook.py or
gather.py). ``CATCHERS`` says, for each, which cases of the default selection
must fail (shell-style patterns): the proof that the catalog and the
tolerances catch the kind of defect named in the docstring.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.nn.functional import all_reduce as diff_all_reduce

from float32_syncbn import Float32SyncBN
from gather import GatherSyncBN, _GatherFn
from textbook import TextbookSyncBN


class EqualWeightMerge(TextbookSyncBN):
    """Per-rank means and variances averaged with equal weights, ignoring counts (pytorch#22192)."""

    def batch_stats(self, x, dims):
        xd = x.double()
        ws = dist.get_world_size(self.group())
        n = x.numel() // x.shape[1]
        # Sums over the (possibly empty) local batch keep every rank's autograd graph, and so its
        # backward collectives, the same: the defect is the weighting, not a hang.
        mean_r = xd.sum(dims) / max(n, 1)
        var_r = (xd * xd).sum(dims) / max(n, 1) - mean_r**2
        both = self.reduce(torch.cat([mean_r, var_r + mean_r**2])) / ws
        mean = both[: x.shape[1]]
        var = both[x.shape[1]:] - mean**2
        total = self.reduce(torch.full((1,), float(n), dtype=torch.float64))[0]
        return mean, var, total


class NaiveVariance(TextbookSyncBN):
    """Variance as E[x^2] - E[x]^2 in float32: cancellation with a large mean."""

    def batch_stats(self, x, dims):
        xf = x.float()
        c = x.shape[1]
        n_local = torch.full((1,), x.numel() / c, dtype=torch.float32)
        both = self.reduce(torch.cat([n_local, xf.sum(dims), (xf * xf).sum(dims)]))
        n = both[0]
        mean = both[1:1 + c] / n
        var = both[1 + c:] / n - mean * mean
        return mean.double(), var.double(), n.double()


class BiasedRunningVar(TextbookSyncBN):
    """running_var updated with the biased variance (no Bessel correction)."""

    def update_running(self, mean, var, n, factor):
        super().update_running(mean, var * (n - 1) / n if n > 1 else var, n, factor)


class NoGradThroughStats(TextbookSyncBN):
    """Backward ignores the statistics' dependence on the input (only dy * w * invstd)."""

    def batch_stats(self, x, dims):
        mean, var, n = super().batch_stats(x, dims)
        return mean.detach(), var.detach(), n


class WorldSizeBackward(GatherSyncBN):
    """Backward divides by world_size * local count instead of the global count (pytorch#36382)."""

    def backward_count(self, total, x):
        return dist.get_world_size(self.process_group or dist.group.WORLD) * max(x.numel() // x.shape[1], 1)


class ChannelsLastReadAsNCHW(TextbookSyncBN):
    """Reads a channels_last tensor's memory as if it were NCHW: channels mixed."""

    def forward(self, x):
        if x.dim() in (4, 5) and not x.is_contiguous() and x.numel():
            x = torch.as_strided(x, x.shape, torch.empty(x.shape).stride())
        return super().forward(x)


class OutputLosesChannelsLast(TextbookSyncBN):
    """Returns a contiguous output for channels_last input."""

    def finish(self, x, y):
        return super().finish(x, y).contiguous()


class IgnoresProcessGroup(TextbookSyncBN):
    """Synchronizes over the whole world whatever process_group says (pytorch#38874)."""

    def group(self):
        return dist.group.WORLD


class EvalUsesBatchStats(TextbookSyncBN):
    """Eval mode normalizes with the batch statistics instead of the running ones."""

    def forward(self, x):
        if not self.training and self.running_mean is not None:
            dims = [0] + list(range(2, x.dim()))
            xd = x.double()
            y = self.normalize(x, xd.mean(dims), xd.var(dims, unbiased=False))
            if self.affine:
                s = self.shape(x)
                y = y * self.weight.double().view(s) + self.bias.double().view(s)
            return self.finish(x, y)
        return super().forward(x)


class OutputInParamDtype(TextbookSyncBN):
    """Returns the output in the parameters' dtype instead of the input's."""

    def finish(self, x, y):
        return y.to(self.weight.dtype if self.weight is not None else x.dtype)


class EmptyRankPoisons(TextbookSyncBN):
    """An empty rank contributes its 0/0 mean (NaN) to the merge."""

    def batch_stats(self, x, dims):
        xd = x.double()
        c = x.shape[1]
        n = x.numel() // c
        mean_r = xd.sum(dims) / n  # 0/0 = NaN on an empty rank, still connected to its (empty) input
        both = self.reduce(torch.cat([torch.full((1,), float(n), dtype=torch.float64), mean_r * n]))
        total, mean = both[0], both[1:] / both[0]
        d = xd - mean.view(self.shape(x))
        var = self.reduce((d * d).sum(dims)) / total
        return mean, var, total


class MomentumNoneAsDefault(TextbookSyncBN):
    """momentum=None (cumulative average) treated as momentum 0.1."""

    def momentum_factor(self):
        return 0.1 if self.momentum is None else self.momentum


class BatchesNotCounted(TextbookSyncBN):
    """num_batches_tracked never incremented."""

    def count_batches(self):
        pass

    def momentum_factor(self):
        return 1.0 if self.momentum is None else self.momentum


class EpsOutsideSqrt(TextbookSyncBN):
    """1 / (sqrt(var) + eps) instead of 1 / sqrt(var + eps)."""

    def normalize(self, x, mean, var):
        s = self.shape(x)
        return (x.double() - mean.view(s)) / (torch.sqrt(var.view(s)) + self.eps)


class GradWeightAveraged(TextbookSyncBN):
    """Each rank's weight/bias gradients averaged over ranks inside SyncBN (DDP's job, done twice)."""

    def forward(self, x):
        if not (self.affine and self.training and dist.is_initialized()):
            return super().forward(x)
        ws = dist.get_world_size(self.group())
        w, b = self.weight, self.bias
        self.__dict__["_avg"] = True
        try:
            self._parameters["weight"] = self.reduce(w / ws)
            self._parameters["bias"] = self.reduce(b / ws)
            return super().forward(x)
        finally:
            self._parameters["weight"], self._parameters["bias"] = w, b


class HalfCounts(TextbookSyncBN):
    """Element counts carried in half precision: 2049 becomes 2048."""

    def batch_stats(self, x, dims):
        mean, var, n = super().batch_stats(x, dims)
        n_half = n.half().double()
        return mean * n / n_half, var * n / n_half, n_half


class HalfAccumulation(TextbookSyncBN):
    """Sums accumulated in the input's half precision when the input is half (overflow, lost digits)."""

    def batch_stats(self, x, dims):
        if x.dtype not in (torch.float16, torch.bfloat16):
            return super().batch_stats(x, dims)
        c = x.shape[1]
        n_local = torch.full((1,), x.numel() / c, dtype=torch.float64)
        s = x.sum(dims, dtype=x.dtype).double()
        both = self.reduce(torch.cat([n_local, s]))
        n, mean = both[0], both[1:] / both[0]
        d = (x - mean.view(self.shape(x)).to(x.dtype))
        var = self.reduce((d * d).sum(dims, dtype=x.dtype).double()) / n
        return mean, var, n


class HalfGradSums(Float32SyncBN):
    """Its backward's per-channel sums of the gradient rounded to the gradient's dtype when that is half (as
    torch's contiguous CUDA kernel rounds its partials: pytorch#195701): a loss scaled by 2**16 whose gradient
    has a mean passes 65,504, inf."""

    def grad_sums(self, dy, dya, xmu):
        sum_dy, sum_dy_xmu = super().grad_sums(dy, dya, xmu)
        if dy.dtype in (torch.float16, torch.bfloat16):
            return sum_dy.to(dy.dtype).to(sum_dy.dtype), sum_dy_xmu.to(dy.dtype).to(sum_dy.dtype)
        return sum_dy, sum_dy_xmu


class DropsChannelTail(TextbookSyncBN):
    """Channels past the first 64 never written: zeros (the launch bug of pytorch#57077)."""

    def finish(self, x, y):
        out = super().finish(x, y)
        if out.shape[1] > 64:
            out = out.clone()
            out[:, 64:] = 0
        return out



class _ModuleSavedFn(torch.autograd.Function):
    """gather.py's function, except that what backward needs is kept on the module, not in the context."""

    @staticmethod
    def forward(ctx, x, group, eps, module):
        class _Slot:  # collects what gather's forward saves for backward
            def save_for_backward(self, *tensors):
                self.saved_tensors = tensors

        slot = _Slot()
        out = _GatherFn.forward(slot, x, group, eps, module)
        module._saved = slot  # the defect: one slot per module, not one per forward
        ctx.module = module
        return out

    @staticmethod
    def backward(ctx, grad_xhat, gm, gm2, gt):
        return _GatherFn.backward(ctx.module._saved, grad_xhat, gm, gm2, gt)  # whatever the module holds now


class SavesStatsOnModule(GatherSyncBN):
    """Keeps the statistics for backward on the module: a second forward before the backward overwrites
    those of the first (two forwards, one backward: pytorch#175024 and kin)."""

    def forward(self, x):
        if not (self.training and dist.is_initialized()):
            return super().forward(x)
        xhat, mean, m2, total = _ModuleSavedFn.apply(x, self.process_group or dist.group.WORLD, self.eps, self)
        with torch.no_grad():
            self.num_batches_tracked += 1
            f = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
            n = float(total)
            self.running_mean.copy_((1 - f) * self.running_mean.double() + f * mean.detach())
            self.running_var.copy_((1 - f) * self.running_var.double() + f * m2.detach() / max(n - 1, 1))
        return self._affine(xhat, x)


class CachedCount(TextbookSyncBN):
    """Bessel's correction with the element count of the first batch, kept (pytorch#22192): wrong once the
    batch size changes, as the last batch of an epoch does."""

    def update_running(self, mean, var, n, factor):
        if not hasattr(self, "_first_count"):
            self._first_count = n
        super().update_running(mean, var, self._first_count, factor)


class SyncsAlone(TextbookSyncBN):
    """Synchronizes in a group of one process too (torch's ``need_sync`` written ``world_size >= 1``): the
    results are right, and a collective is issued where there is nothing to synchronize."""

    def reduce(self, t):
        return diff_all_reduce(t, group=self.group())


class EvalSyncs(TextbookSyncBN):
    """In eval, averages the running statistics over the ranks first, "to keep replicas consistent": a
    collective in evaluation, which hangs validation on one rank (pytorch#48988)."""

    def forward(self, x):
        if not self.training and self.running_mean is not None and dist.is_initialized():
            with torch.no_grad():
                both = torch.cat([self.running_mean, self.running_var])
                dist.all_reduce(both, group=self.group())
                both /= dist.get_world_size(self.group())
        return super().forward(x)


class AssumesContiguous(TextbookSyncBN):
    """Reads the input's memory as if it were contiguous (as_strided on its storage): a permuted or sliced
    view is read wrong (pytorch#62967, #63224)."""

    def forward(self, x):
        if x.numel() and not x.is_contiguous() and not x.is_contiguous(memory_format=torch.channels_last) \
                and not (x.dim() == 5 and x.is_contiguous(memory_format=torch.channels_last_3d)):
            x = torch.as_strided(x, x.shape, torch.empty(x.shape).stride(), x.storage_offset())
        return super().forward(x)


class WidthLimit1024(TextbookSyncBN):
    """A kernel whose shared buffer holds 1024 channels: channel c >= 1024 gets the statistics of c - 1024
    (wrong at ResNet-50's 2048: apex#1768)."""

    def batch_stats(self, x, dims):
        mean, var, n = super().batch_stats(x, dims)
        if mean.numel() > 1024:
            idx = torch.arange(mean.numel()) % 1024
            mean, var = mean[idx], var[idx]
        return mean, var, n


class NormalizesInPlace(TextbookSyncBN):
    """Subtracts the mean from its input in place to save memory: the caller's tensor is changed."""

    def normalize(self, x, mean, var):
        y = super().normalize(x, mean, var)
        with torch.no_grad():
            x.sub_(mean.view(self.shape(x)).to(x.dtype))
        return y


class RankOrderMerge(GatherSyncBN):
    """Merges the gathered statistics starting from its own rank's row: each rank rounds differently, so
    replicas' running statistics drift apart by ULPs, all within tolerance of the oracle."""

    def forward(self, x):
        if self.training and dist.is_initialized():
            shift = dist.get_rank(self.process_group or dist.group.WORLD)
            original = dist.all_gather

            def rotated(rows, row, group=None, async_op=False):
                out = original(rows, row, group=group, async_op=async_op)
                rows[:] = rows[shift:] + rows[:shift]
                return out

            dist.all_gather = rotated
            try:
                out = super().forward(x.float() if x.dtype == torch.float64 else x)
            finally:
                dist.all_gather = original
            return out.to(x.dtype)
        return super().forward(x)


class LocalRunningStats(TextbookSyncBN):
    """Running statistics from the rank's own batch, not the group's: under DDP the buffer broadcast hides
    it on rank 0's replica (PR #46636, pytorch#63917)."""

    def update_running(self, mean, var, n, factor):
        dims = [0] + list(range(2, self._x.dim()))
        xd = self._x.detach().double()
        if xd.numel():
            local_n = xd.numel() / xd.shape[1]
            super().update_running(xd.mean(dims), xd.var(dims, unbiased=False), local_n, factor)
        else:
            super().update_running(mean, var, n, factor)

    def forward(self, x):
        self._x = x
        return super().forward(x)


class GatherSizeDiffers(TextbookSyncBN):
    """All-gathers one row per sample, so ranks with different batch sizes hand the collective operands of
    different sizes: the 2020 apex break between two PyTorch commits ("All tensor operands to scatter/gather
    must have the same size")."""

    def batch_stats(self, x, dims):
        if dist.is_initialized():
            per_sample = x.detach().double().flatten(1).mean(1)
            rows = [torch.empty_like(per_sample) for _ in range(dist.get_world_size(self.group()))]
            dist.all_gather(rows, per_sample, group=self.group())
        return super().batch_stats(x, dims)


class EmptyRankSkips(TextbookSyncBN):
    """A rank with an empty batch returns at once, "nothing to normalize": it skips the collectives its peers
    wait in (the hang behind pytorch#36530 and detectron2#1807)."""

    def forward(self, x):
        if self.training and x.numel() == 0:
            return x.clone()
        return super().forward(x)


class EmptyRankSendsInputDtype(TextbookSyncBN):
    """A rank with an empty batch sends its (zero) statistics in the input's dtype, the others in float64: the
    collective's operands differ in bytes (the pattern of torch's float16 empty-rank crash)."""

    def reduce(self, t):
        if self._x.numel() == 0 and t.numel() == self._x.shape[1] + 1:
            return super().reduce(t.to(self._x.dtype)).double()
        return super().reduce(t)

    def forward(self, x):
        self._x = x
        return super().forward(x)


class IgnoresGroupOnce(TextbookSyncBN):
    """Gathers the count and sum over its process group, then the squared deviations over the whole world: one
    of two collectives ignores the group (the batched-collectives defect of pytorch#38246)."""

    def batch_stats(self, x, dims):
        xd = x.double()
        c = x.shape[1]
        n_local = torch.full((1,), x.numel() / c, dtype=torch.float64)
        both = diff_all_reduce(torch.cat([n_local, xd.sum(dims)]), group=self.group())
        n, mean = both[0], both[1:] / both[0]
        d = xd - mean.view(self.shape(x))
        return mean, diff_all_reduce((d * d).sum(dims), group=dist.group.WORLD) / n, n


class IgnoresBiasFalse(TextbookSyncBN):
    """Takes the keyword bias=False and keeps a bias all the same (a constructor that predates the keyword's
    meaning: pytorch#176573 gave BatchNorm a weight without a bias)."""

    def __init__(self, *args, bias=True, **kwargs):
        super().__init__(*args, **kwargs)


class AffineNeedsBias(TextbookSyncBN):
    """The affine transform applied only when the layer has both a weight and a bias: bias=False drops the weight
    too (an ``if self.weight is not None and self.bias is not None`` guard)."""

    def forward(self, x):
        if self.bias is not None or not self.affine:
            return super().forward(x)
        self.affine = False  # the textbook's forward then normalizes only
        try:
            return super().forward(x)
        finally:
            self.affine = True


class UniformInitWeight(TextbookSyncBN):
    """A weight drawn from U(0, 1) at construction, as _BatchNorm's reset_parameters did before the fix of
    pytorch#12259 (nn.BatchNorm's weight starts at ones)."""

    def reset_parameters(self):
        super().reset_parameters()
        if self.affine:
            torch.nn.init.uniform_(self.weight)


class IgnoresFactoryDtype(TextbookSyncBN):
    """Takes the keywords device= and dtype= and drops them: its parameters are float32 on the CPU whatever was
    asked for (pytorch#54508 passed them on)."""

    def __init__(self, *args, device=None, dtype=None, **kwargs):
        super().__init__(*args, **kwargs)


class StatsFlagIgnored(TextbookSyncBN):
    """Updates and counts its running statistics whenever it has them, whatever ``track_running_stats`` says
    now (a flag switched off after construction: pytorch#44445)."""

    def forward(self, x):
        flag = self.track_running_stats
        self.track_running_stats = self.running_mean is not None
        try:
            return super().forward(x)
        finally:
            self.track_running_stats = flag


class _CountOnLoad(TextbookSyncBN):
    """What a state dict without num_batches_tracked loads as the count: ``missing_count``'s answer."""

    def missing_count(self):
        raise NotImplementedError

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        key = prefix + "num_batches_tracked"
        if self.track_running_stats and key not in state_dict:
            state_dict[key] = self.missing_count()
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)


class ResetsCountOnLoad(_CountOnLoad):
    """A state dict without num_batches_tracked resets the count to 0 (pytorch#110361): momentum=None's
    average restarts after the load."""

    def missing_count(self):
        return torch.tensor(0, dtype=torch.long)


class KeepsMetaCount(_CountOnLoad):
    """A state dict without num_batches_tracked keeps the module's count, a meta tensor where the module was
    built on the meta device (pytorch#115285 replaced it with a real 0)."""

    def missing_count(self):
        return self.num_batches_tracked


class FlatGatherOffGloo(TextbookSyncBN):
    """Gathers the ranks' counts into one flat tensor on every backend not named gloo, as torch's SyncBatchNorm
    picks its all_gather by the backend's name: a backend with the list all_gather only (MPI's, third-party
    accelerators': pytorch#85628, the review of pytorch#104250) refuses it."""

    def batch_stats(self, x, dims):
        group = self.group()
        ws = dist.get_world_size(group)
        if ws > 1 and dist.get_backend(group) != "gloo":
            mine = torch.full((1,), float(x.numel() // x.shape[1]), dtype=torch.float64)
            counts = torch.empty(ws, dtype=torch.float64)
            flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # 2.13's name, older
            flat(counts, mine, group=group)
        return super().batch_stats(x, dims)


# Collective defects -> (a case that shows it, the status it must get, what the message must name).
COLLECTIVE_DEFECTS = {
    EvalSyncs: ("module-config/train-eval-train/ws2", "mismatch",
                "eval issued 1 collective(s), first all_reduce float32[16] over ranks [0, 1]"),
    EmptyRankSkips: ("allgather-shape/empty-0-5/float32-float32/contiguous/ws2", "hang",
                     "desync: rank 1 all_reduce float64[6] vs rank 0 nothing: it finished the case without this "
                     "collective (collective 0 over ranks [0, 1], step 0)"),
    EmptyRankSendsInputDtype: ("allgather-shape/empty-0-5/float32-float32/contiguous/ws2", ("crash", "error"),
                               "desync: rank 0 all_reduce float32[6] vs rank 1 float64[6] (collective 0 over ranks "
                               "[0, 1], step 0)"),
    IgnoresGroupOnce: ("process-group/pairs-02-13/ws4", "mismatch",
                       "(all_reduce float64[8], step 0) went over ranks [0, 1, 2, 3], not the case's group"),
    SyncsAlone: ("process-group/split-empty-0-12/ws3", "mismatch",
                 "rank 0 is alone in its group and still issued 8 collective(s), first all_reduce float64[9] over "
                 "ranks [0] (step 0): a group of one process has nothing to synchronize"),
}


# Defect -> (patterns of default-selection cases that must catch it, the status they must give, the tensor whose
# metric must fail). Caught means a judgement on the tensor the defect corrupts, not some crash on the way.
CATCHERS = {
    EqualWeightMerge: (["allgather-shape/uneven-*", "allgather-shape/empt*"], "mismatch", "train.output"),
    NaiveVariance: (["numerics/offset-*"], "mismatch", "train.output"),
    BiasedRunningVar: (["module-config/*"], "mismatch", "running_var"),
    NoGradThroughStats: (["module-config/*"], "mismatch", "grad_input"),
    WorldSizeBackward: (["allgather-shape/uneven-*"], "mismatch", "grad_input"),
    ChannelsLastReadAsNCHW: (["channels-last/*", "*/channels_last*"], "mismatch", "output"),
    OutputLosesChannelsLast: (["channels-last/*", "*/channels_last*"], "mismatch", "output"),
    IgnoresProcessGroup: (["process-group/*"], "mismatch", "train.output"),
    EvalUsesBatchStats: (["module-config/train-eval-train/*", "module-config/eval-only/*"], "mismatch",
                         "eval.output"),
    OutputInParamDtype: (["mixed-precision/*"], "mismatch", "output"),
    EmptyRankPoisons: (["allgather-shape/empt*", "*/empty-rank/*"], "mismatch", "output"),
    MomentumNoneAsDefault: (["module-config/momentum-none-*"], "mismatch", "running_mean"),
    BatchesNotCounted: (["module-config/*"], "mismatch", "num_batches_tracked"),
    EpsOutsideSqrt: (["numerics/var-*", "module-config/eps-*"], "mismatch", "output"),
    GradWeightAveraged: (["allgather-shape/uneven-*"], "mismatch", "grad_weight"),
    HalfCounts: (["mixed-precision/count-2049/*"], "mismatch", "running_var"),
    HalfAccumulation: (["mixed-precision/half-sum-overflow/*"], "mismatch", "output"),
    HalfGradSums: (["mixed-precision/scaled-grads*"], "mismatch", "grad_input"),
    DropsChannelTail: (["numerics/channels-67/*", "numerics/channels-130/*", "channels-last/channels-*"], "mismatch",
                       "output"),
    SavesStatsOnModule: (["training-loop/two-forwards/*"], "mismatch", "grad_input"),
    CachedCount: (["training-loop/last-batch-smaller/*"], "mismatch", "running_var"),
    EvalSyncs: (["training-loop/eval-on-rank0/*"], "error", "CollectiveForbidden"),
    AssumesContiguous: (["training-loop/permuted-input/*", "training-loop/sliced-input/*"], "mismatch", "output"),
    WidthLimit1024: (["training-loop/width-2048/*"], "mismatch", "output"),
    NormalizesInPlace: (["training-loop/*"], "mismatch", "input"),
    RankOrderMerge: (["allgather-shape/uneven-*", "training-loop/*"], "mismatch", "across_ranks"),
    LocalRunningStats: (["ddp/*"], "mismatch", "running_mean"),
    GatherSizeDiffers: (["allgather-shape/uneven-*"], ("crash", "error"), None),
    IgnoresBiasFalse: (["module-config/bias-off*"], "mismatch", "layer.bias"),
    UniformInitWeight: (["module-config/as-built/*"], "mismatch", "train.output"),
    IgnoresFactoryDtype: (["module-config/factory-*"], "mismatch", "layer.factory"),
    StatsFlagIgnored: (["module-config/stats-off-after/*"], "mismatch", "running_mean"),
    ResetsCountOnLoad: (["module-config/legacy-state-dict/*"], "mismatch", "running_mean"),
    KeepsMetaCount: (["module-config/meta-assign/*"], ("error", "crash"), "meta"),
    AffineNeedsBias: (["module-config/bias-off*"], "mismatch", "train.output"),


    FlatGatherOffGloo: (["*/list-contract"], "error", "no support for _allgather_base"),
}
