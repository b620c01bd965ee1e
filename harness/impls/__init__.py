"""Implementations under test: adapters for the reference, torch, apex and plugins.

- :mod:`harness.impls.base`: the adapter shape (:class:`Impl`, :class:`Capabilities`, :class:`ReproBinding`);
- :mod:`harness.impls.registry`: names to adapters (the built-ins' table, ``MODULE:ATTR``, entry points);
- :mod:`harness.impls.torch_layer`: the base of the adapters over torch's own layer reached through a
  library (:class:`~harness.impls.torch_layer.TorchLayerAdapter`);
- one module per implementation: :mod:`~harness.impls.reference` (ours, with its
  SyncBatchNorm), :mod:`~harness.impls.torch_native` and
  :mod:`~harness.impls.torch_emulation` (torch's module on CPU), :mod:`~harness.impls.torch_patched`
  (``torch@PATH``: a patched copy of torch's SyncBatchNorm run as torch),
  :mod:`~harness.impls.cuda_contract` (what torch's CUDA kernels accept, enforced by the emulation),
  :mod:`~harness.impls.cuda_plan` (the calls torch's SyncBN makes for a case, checked before it runs),
  :mod:`~harness.impls.cuda_arith` (what they compute, transliterated: the emulation's arithmetic) and
  :mod:`~harness.impls.cuda_reduce` (its reductions, partial by partial),
  :mod:`~harness.impls.apex` (and :mod:`~harness.impls.apex_build`, its extension built from a user's
  checkout), :mod:`~harness.impls.plugin`, and the opt-in maintained code:
  :mod:`~harness.impls.timm_converter` and :mod:`~harness.impls.timm_layer` (timm's converter and its
  SyncBatchNormAct), :mod:`~harness.impls.detectron2` (NaiveSyncBatchNorm),
  :mod:`~harness.impls.mmengine_converter`, :mod:`~harness.impls.lightning_converter`.
"""

from harness.impls.base import Capabilities, Impl, ReproBinding
from harness.impls.registry import ENTRY_POINT_GROUP, builtin_names, default_names, known_names, resolve, resolve_impls

__all__ = ["Capabilities", "Impl", "ReproBinding", "ENTRY_POINT_GROUP", "builtin_names", "default_names",
           "known_names", "resolve", "resolve_impls"]
