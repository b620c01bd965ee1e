"""Probe implementations for the engine's tests: correct SyncBN, except on rank 1.

Each is a plugin (``probes:NAME``) built on the reference SyncBN; on rank 1
of the default group it misbehaves in one precise way during forward, while
its peers enter the statistics all_gather as usual. A few misbehave on every
rank, or play out a whole crash's pattern over four ranks (their docstrings
say how).
"""

from __future__ import annotations

import os
import signal
import time

import torch.distributed as dist
import torch.nn.functional as F

from harness.impls.reference import SyncBatchNorm


class _Probe(SyncBatchNorm):
    """Reference SyncBN whose subclasses' ``misbehave(input)`` runs on rank 1 (a tensor it returns replaces
    the output)."""

    def forward(self, input):
        if dist.is_initialized() and dist.get_rank() == 1:
            out = self.misbehave(input)
            if out is not None:
                return out
        return super().forward(input)


class RaiseOnRank1(_Probe):
    def misbehave(self, input):
        raise RuntimeError("planted failure on rank 1")


class RaiseOnEveryRank(SyncBatchNorm):
    """Raises on every rank before any collective: a failure that leaves nothing in flight."""

    def forward(self, input):
        raise ValueError("planted failure on every rank, before any collective")


class RaiseOnEveryRankAfterForward(SyncBatchNorm):
    """Runs the reference forward (its collectives complete on every rank), then raises on every rank."""

    def forward(self, input):
        super().forward(input)
        raise ValueError("planted failure on every rank, after the forward's collectives")


class SegfaultOnRank1(_Probe):
    def misbehave(self, input):
        os.kill(os.getpid(), signal.SIGSEGV)


class AbortOnRank1(_Probe):
    def misbehave(self, input):
        os.abort()


class KillOnRank1(_Probe):
    def misbehave(self, input):
        os.kill(os.getpid(), signal.SIGKILL)


class ExitOnRank1(_Probe):
    def misbehave(self, input):
        os._exit(3)


class SleepOnRank1(_Probe):
    """Sleeps for an hour; with ``SYNCBN_PROBE_MARKER`` set, first creates that file (a test waits for it)."""

    def misbehave(self, input):
        marker = os.environ.get("SYNCBN_PROBE_MARKER")
        if marker:
            with open(marker, "w") as f:
                f.write(str(os.getpid()))
        time.sleep(3600)


class FailsOnRendezvousEnv(SyncBatchNorm):
    """Correct, but raises on any rank that can see a rendezvous variable of the caller's environment."""

    def forward(self, input):
        from harness.engine import RENDEZVOUS_ENV

        leaked = {k: os.environ[k] for k in RENDEZVOUS_ENV if k in os.environ}
        if leaked:
            raise RuntimeError(f"the caller's rendezvous environment reached this rank: {leaked}")
        return super().forward(input)


class OtherCollectiveOnRank1(_Probe):
    """Enters an all_reduce where its peers enter the statistics all_gather: both wait for good (a deadlock)."""

    def misbehave(self, input):
        total = input.new_zeros(1)
        dist.all_reduce(total)
        return super().forward(input)


class SkipCollectiveOnRank1(_Probe):
    """Normalizes with its own batch only: never enters the all_gather its peers wait in."""

    def misbehave(self, input):
        return F.batch_norm(input, None, None, self.weight, self.bias, True, 0.0, self.eps)


class ZeroesGradOutputInPlace(SyncBatchNorm):
    """Correct forward and backward, on every rank, after zeroing the upstream gradient it is given in place
    (a hook on the output): the caller's grad_output tensor is changed."""

    def forward(self, input):
        out = super().forward(input)
        if out.requires_grad:
            out.register_hook(lambda grad: grad.zero_())
        return out


class DrawsProgressBar(SyncBatchNorm):
    """Draws a (disabled) tqdm bar in forward, as torch.fx's interpreter and inductor's compile waits do in a
    rank under torch.compile: tqdm's first bar in a process makes its lock."""

    def forward(self, input):
        from tqdm import tqdm

        for _ in tqdm(range(1), disable=True):
            pass
        return super().forward(input)


class AbortOnRank0WhilePeersRaiseInACollective(SyncBatchNorm):
    """On four ranks, the pattern of torch's empty-rank crash there: rank 0 dies (SIGABRT), ranks 1 and 3 raise
    inside torch.distributed (gloo's 'connection closed' there; here an all_gather given one output for a group
    of four), and rank 2 stays inside the statistics all_gather, waiting for rank 1 (alive, idle)."""

    def forward(self, input):
        rank = dist.get_rank()
        if rank == 0:
            os.abort()
        if rank != 2:
            dist.all_gather([input.new_zeros(1)], input.new_zeros(1))
        return super().forward(input)
