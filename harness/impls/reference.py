"""Adapter for the reference SyncBN (:mod:`harness.reference`), which supports every case."""

from __future__ import annotations

from harness import __version__, extension
from harness.case import Case
from harness.errors import ImplUnavailable, KernelBuildError
from harness.impls import Capabilities, Impl, register


@register("reference")
class ReferenceImpl(Impl):
    capabilities = Capabilities(convert=True)

    def version(self) -> str:
        return __version__

    def check_available(self) -> None:
        try:
            extension.load()
        except KernelBuildError as exc:
            raise ImplUnavailable(f"reference kernels unavailable: {exc}") from exc

    def setup_rank(self, device: str) -> None:
        extension.load()

    def build(self, case: Case, process_group, device: str):
        from harness.reference import SyncBatchNorm

        return SyncBatchNorm(case.channels, eps=case.eps, momentum=case.momentum, affine=case.affine,
                             track_running_stats=case.track_running_stats, process_group=process_group)

    def convert(self, model, process_group):
        from harness.reference import SyncBatchNorm

        return SyncBatchNorm.convert_sync_batchnorm(model, process_group)
