"""Adapter for ``apex.parallel.SyncBatchNorm`` (and ``apex.parallel.convert_syncbn_model``).

Design: :func:`probe` finds which of apex's states this environment is in, the
way apex itself decides (``apex/parallel/__init__.py`` tries ``import syncbn``
then ``from .optimized_sync_batchnorm import SyncBatchNorm``, and on
``ImportError`` exposes ``sync_batchnorm.SyncBatchNorm`` with the error kept
as ``syncbn_import_error``). So the state is read from the class apex really
exports, never guessed from a module being findable:

- ``absent``: apex not installed (not on the package index; users build it from source);
- ``removed``: apex installed without ``apex.parallel`` (removed in 2025, NVIDIA/apex PR #1896);
- ``broken``: apex or ``apex.parallel`` fails to import (the exception is the reason);
- ``fallback``: the Python fallback, mode ``python-fallback``;
- ``optimized``: the ``syncbn`` CUDA extension, mode ``optimized``.

What the harness does around apex's code, and nothing more:
- The Python fallback calls ``torch.cuda.nvtx.range_push``/``range_pop``
  (profiling marks, no effect on results). A CPU-only torch build has no NVTX
  and raises there, so in rank processes of such a build those two calls are
  made no-ops (mode ``python-fallback (nvtx no-op)``); everything else is apex's.
- The optimized extension's ``channel_last=True`` takes the channel as the
  LAST dimension (an NHWC-shaped tensor). Channels-last input (NCHW shape,
  NHWC memory) is handed over as that NHWC view (a permute, no copy) and the
  output viewed back, as an apex user with channels-last data would do.
  With ``channel_last=False`` apex calls ``input.contiguous()``.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

from harness.catalog.case import Case
from harness.errors import ImplUnavailable
from harness.impls.base import Capabilities, Impl, ReproBinding
from harness.judge.mode import Mode

PR_REMOVED = "NVIDIA/apex PR #1896"
INSTALL_HINT = (f"not on the package index: build it from source at a commit before {PR_REMOVED}, see "
                "docs/development.md#installing-apex")


class ApexProbe(NamedTuple):
    """Which state apex is in here (``kind``) and the sentence that reports it (``text``)."""

    kind: str  # absent | removed | broken | fallback | optimized
    text: str


def probe() -> ApexProbe:
    """Find apex's state by importing it as a user would (cheap after the first call)."""
    import importlib
    import importlib.util

    try:
        found = importlib.util.find_spec("apex") is not None
    except (ImportError, ValueError) as exc:
        return ApexProbe("broken", f"installed but cannot be located ({type(exc).__name__}: {exc})")
    if not found:
        return ApexProbe("absent", f"not installed ({INSTALL_HINT})")
    try:
        apex = importlib.import_module("apex")
    except Exception as exc:  # noqa: BLE001 - any import failure is the reason apex is unusable
        return ApexProbe("broken", f"installed but `import apex` fails ({type(exc).__name__}: {exc})")
    where = getattr(apex, "__file__", None)
    if where is None:  # a bare directory named apex on sys.path, not the package
        paths = ", ".join(getattr(apex, "__path__", []))
        return ApexProbe("broken", f"`import apex` finds a directory without __init__.py ({paths}), not apex: "
                                   "remove it from sys.path / PYTHONPATH or install apex")
    if importlib.util.find_spec("apex.parallel") is None:
        return ApexProbe("removed", f"installed ({where}) without apex.parallel: removed in 2025 by {PR_REMOVED}; "
                                    f"install a commit before it to test apex.parallel.SyncBatchNorm")
    try:
        parallel = importlib.import_module("apex.parallel")
        cls = parallel.SyncBatchNorm
    except Exception as exc:  # noqa: BLE001
        return ApexProbe("broken", f"apex.parallel fails to import ({type(exc).__name__}: {exc})")
    err = getattr(cls, "syncbn_import_error", None)
    if cls.__module__.endswith("optimized_sync_batchnorm") and err is None:
        import sys

        ext = getattr(sys.modules.get("syncbn"), "__file__", "?")
        return ApexProbe("optimized", f"apex.parallel present, optimized CUDA extension (syncbn at {ext})")
    why = f"{type(err).__name__}: {err}" if err is not None else "apex exports the Python SyncBatchNorm"
    return ApexProbe("fallback", f"apex.parallel present, Python fallback (no optimized extension: {why})")


def nvtx_usable() -> bool:
    """Whether this torch build has NVTX (CPU-only builds raise in ``torch.cuda.nvtx.range_push``)."""
    import torch

    return hasattr(torch._C, "_nvtx")


def _nvtx_noop() -> None:
    """Make ``torch.cuda.nvtx.range_push``/``range_pop`` no-ops in this (rank) process."""
    import torch.cuda.nvtx as nvtx

    nvtx.range_push = lambda msg: 0
    nvtx.range_pop = lambda: 0


# Both forms are Python modules over a custom autograd Function, which TorchScript cannot compile (on an H200,
# 2026-11-28, the optimized form failed at its `z == None`); apex never said they could be scripted.
# Neither constructor has a bias keyword (a weight without a bias), nor device= and dtype=: bias_off=False,
# factory_kwargs=False.
_FALLBACK_CAPS = Capabilities(convert=True, script=False, bias_off=False, factory_kwargs=False)
# The syncbn kernels dispatch float and half only (DISPATCH_FLOAT_AND_HALF in csrc/welford.cu);
# parameters are float or the input's dtype.
_OPTIMIZED_CAPS = Capabilities(devices=frozenset({"cuda"}), dtypes=frozenset({"float16", "float32"}),
                               param_dtypes=frozenset({"float16", "float32"}), convert=True, script=False,
                               bias_off=False, factory_kwargs=False)


class ApexImpl(Impl):
    """``apex.parallel.SyncBatchNorm`` as apex exports it here (fallback or optimized)."""

    name = "apex"

    def repro_binding(self) -> ReproBinding:
        # The optimized extension's kernels are CUDA kernels: its file runs on a GPU (the fallback's on CPU).
        return ReproBinding("apex", "from apex.parallel import SyncBatchNorm", on_cuda=False,
                            cuda_only=probe().kind == "optimized")

    @property
    def capabilities(self) -> Capabilities:  # type: ignore[override]
        return _OPTIMIZED_CAPS if probe().kind == "optimized" else _FALLBACK_CAPS

    @property
    def mode(self) -> Optional[Mode]:  # type: ignore[override]
        kind = probe().kind
        return {"optimized": Mode.OPTIMIZED, "fallback": Mode.PYTHON_FALLBACK}.get(kind)

    @property
    def mode_notes(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("nvtx no-op",) if self.mode is Mode.PYTHON_FALLBACK and not nvtx_usable() else ()

    def version(self) -> Optional[str]:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("apex")
        except PackageNotFoundError:
            return None

    def check_available(self) -> None:
        p = probe()
        if p.kind not in ("fallback", "optimized"):
            raise ImplUnavailable(f"apex {p.text}")

    def describe(self) -> dict:
        d = super().describe()
        d["apex_state"] = probe().text
        return d

    def setup_rank(self, device: str) -> None:
        if probe().kind == "fallback" and not nvtx_usable():
            _nvtx_noop()

    def build(self, case: Case, process_group, device: str):
        from apex.parallel import SyncBatchNorm

        return construct_apex(SyncBatchNorm, case, process_group)

    def convert(self, model, process_group):
        return convert_apex(model, process_group)

    def forward(self, module, input):
        return apex_forward(module, input)


def construct_apex(cls, case: Case, process_group):
    """apex's SyncBatchNorm for ``case``: positional, as apex's own ``convert_syncbn_model`` calls it
    (the fallback and the optimized class share this prefix of their signatures)."""
    return cls(case.channels, case.eps, case.momentum, case.affine, case.track_running_stats, process_group)


def convert_apex(model, process_group):
    """``apex.parallel.convert_syncbn_model`` with the process group."""
    from apex.parallel import convert_syncbn_model

    return convert_syncbn_model(model, process_group=process_group)


def apex_forward(module, input):
    """Call an apex SyncBatchNorm as a user with this input would.

    The optimized class (it has ``channel_last``) with channels-last input
    (NCHW shape, NHWC memory) gets its NHWC view (a permute, no copy) with
    ``channel_last=True``, and the output is viewed back; any other input goes
    in as it is, with ``channel_last=False``. The Python fallback and 2-D input
    (which apex treats as channel-last itself) are called plainly.
    """
    import torch

    if getattr(module, "channel_last", None) is None or input.dim() <= 2:
        return module(input)
    fmt = torch.channels_last if input.dim() == 4 else torch.channels_last_3d
    nhwc = input.dim() in (4, 5) and input.is_contiguous(memory_format=fmt) and not input.is_contiguous()
    module._specify_channel_last(nhwc)
    if not nhwc:
        return module(input)
    to_last = (0, *range(2, input.dim()), 1)
    back = (0, input.dim() - 1, *range(1, input.dim() - 1))
    return module(input.permute(to_last)).permute(back)
