"""Adapter for ``apex.parallel.SyncBatchNorm`` (and ``apex.parallel.convert_syncbn_model``).

States, each reported precisely (:func:`harness.buildinfo.apex_state`):
- apex not installed (it is not on the package index; users build it from source);
- apex installed without ``apex.parallel`` (removed in 2025, NVIDIA/apex PR #1896);
- ``apex.parallel`` with the Python fallback (no ``syncbn`` extension), mode ``python-fallback``;
- ``apex.parallel`` with the optimized CUDA extension, mode ``optimized`` (``channel_last=True``
  for channels-last cases).
"""

from __future__ import annotations

import importlib.util
from typing import Optional

from harness.case import Case
from harness.errors import ImplUnavailable
from harness.impls import Capabilities, Impl, register


def _optimized() -> bool:
    return importlib.util.find_spec("syncbn") is not None


@register("apex")
class ApexImpl(Impl):
    @property
    def capabilities(self) -> Capabilities:  # type: ignore[override]
        if _optimized():
            # The optimized path runs CUDA kernels; its channel_last kernel covers 4-D NHWC only.
            return Capabilities(devices=frozenset({"cuda"}),
                                memory_formats=frozenset({"contiguous", "channels_last"}))
        return Capabilities()

    @property
    def mode(self) -> Optional[str]:  # type: ignore[override]
        try:
            self.check_available()
        except ImplUnavailable:
            return None
        return "optimized" if _optimized() else "python-fallback"

    def version(self) -> Optional[str]:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("apex")
        except PackageNotFoundError:
            return None

    def check_available(self) -> None:
        from harness.buildinfo import apex_state

        state = apex_state()
        if state == "not installed":
            raise ImplUnavailable("apex is not installed (it is not on the package index: build it from "
                                  "source, a commit before NVIDIA/apex PR #1896 for apex.parallel)")
        if not state.startswith("apex.parallel"):
            raise ImplUnavailable(f"apex unusable: {state}")

    def build(self, case: Case, process_group, device: str):
        from apex.parallel import SyncBatchNorm

        kw = {}
        if _optimized() and case.memory_format == "channels_last":
            kw["channel_last"] = True
        return SyncBatchNorm(case.channels, eps=case.eps, momentum=case.momentum, affine=case.affine,
                             track_running_stats=case.track_running_stats, process_group=process_group, **kw)
