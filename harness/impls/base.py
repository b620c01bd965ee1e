"""What every implementation adapter is: :class:`Impl`, the :class:`Capabilities` it declares, and how a
standalone repro file imports it (:class:`ReproBinding`).

Protocol: an adapter is a small class that says what it supports
(:class:`Capabilities`), checks that it can run here (``check_available``
raises :class:`~harness.errors.ImplUnavailable` with the reason), prepares a
rank process once (``setup_rank``), builds one module per rank (``build``),
converts a whole model (``convert``), reverts one to BatchNorm where it has a
revert of its own (``revert``), calls the module (``forward``) and, for
inference, gives its layers back as shipped (``shipped``).
Anything the adapter does not support is reported ``unsupported`` with the
reason from :meth:`Impl.unsupported_reason`, never silently dropped.
"""

from __future__ import annotations

import abc
import contextlib
from dataclasses import dataclass
from typing import Optional

from harness.catalog.case import Case
from harness.errors import ImplUnavailable
from harness.judge import mode as mode_words
from harness.judge.mode import Mode


def construct_like_syncbn(factory, case: Case, process_group, device: Optional[str] = None):
    """One module from a class or factory with ``torch.nn.SyncBatchNorm``'s constructor, for ``case``.

    The signature: ``(num_features, eps=1e-5, momentum=0.1, affine=True,
    track_running_stats=True, process_group=None)``, keywords after the first;
    a case without bias (``Case.bias`` False) adds the keyword ``bias=False``
    (only then: a factory that predates the keyword builds every other case),
    and a case built in place (``Case.setup`` "factory") the keywords
    ``device=`` (``device``) and ``dtype=`` (the case's parameter dtype).
    """
    extra = ({} if case.bias else {"bias": False}) | factory_keywords(case, device)
    return factory(case.channels, eps=case.eps, momentum=case.momentum, affine=case.affine,
                   track_running_stats=case.track_running_stats, process_group=process_group, **extra)


def factory_keywords(case: Case, device: Optional[str]) -> dict:
    """The constructor keywords ``device=`` and ``dtype=`` (the parameter dtype) of a case built in place
    (``Case.setup`` "factory"); none for any other case."""
    if case.setup != "factory":
        return {}
    import torch

    return {"device": device, "dtype": getattr(torch, case.param_dtype)}


def takes_bias(factory) -> bool:
    """Whether ``factory`` (a class or a function) takes the keyword ``bias`` (or any keyword, ``**kwargs``)."""
    return takes_keywords(factory, ("bias",))


def takes_keywords(factory, names: tuple[str, ...]) -> bool:
    """Whether ``factory`` (a class or a function) takes every keyword of ``names`` (or any, ``**kwargs``)."""
    import inspect

    try:
        params = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):  # no signature to read (a builtin): assume the keywords are there
        return True
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params) or set(names) <= {p.name for p in params}


@dataclass(frozen=True)
class Capabilities:
    """What an implementation declares it can run; anything else is ``unsupported``."""

    devices: frozenset = frozenset({"cpu", "cuda"})
    dtypes: frozenset = frozenset({"float16", "bfloat16", "float32", "float64"})
    param_dtypes: frozenset = frozenset({"float16", "bfloat16", "float32", "float64"})
    memory_formats: frozenset = frozenset({"contiguous", "channels_last", "channels_last_3d"})
    ndims: frozenset = frozenset({2, 3, 4, 5})
    subgroups: bool = True
    momentum_none: bool = True
    affine_off: bool = True
    no_running_stats: bool = True
    empty_ranks: bool = True
    mixed_dtypes: bool = True  # input dtype differing from parameter dtype
    convert: bool = False  # conversion of a whole model (convert_sync_batchnorm or similar)
    graph_capture: bool = True  # a training step can be captured in a CUDA graph (no host syncs)
    fullgraph: bool = True  # meant to compile under torch.compile(fullgraph=True) (no host syncs, no breaks)
    double_backward: bool = True  # its backward is differentiable (create_graph=True: gradient penalties)
    script: bool = True  # meant to go through torch.jit.script
    bias_off: bool = True  # a weight without a bias (BatchNorm's keyword bias=False)
    factory_kwargs: bool = True  # the constructor's device= and dtype= keywords (parameters made in place)
    revert: bool = False  # a revert of a converted model to BatchNorm of its own (``Impl.revert``)

    def to_dict(self) -> dict:
        return {k: sorted(v) if isinstance(v, frozenset) else v for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class ReproBinding:
    """How a short repro file imports an implementation (see :meth:`Impl.repro_binding`)."""

    library: str  # the package a maintainer installs
    code: str  # lines that bind ``SyncBatchNorm`` to a callable with torch.nn.SyncBatchNorm's constructor
    on_cuda: bool  # torch's layer: CUDA when there is one, else the file's CPU stand-ins for torch's CUDA ops
    cuda_only: bool = False  # kernels that exist on CUDA only (the file then needs a GPU)


class Impl(abc.ABC):
    """Base adapter. Subclasses set ``name``, ``capabilities`` and implement ``build``."""

    name: str = ""
    mode: Optional[Mode] = None  # how its kernels run (None: it has one way only)
    mode_notes: tuple[str, ...] = ()  # what else holds of the mode in every task (apex's nvtx stub, say)
    capabilities: Capabilities = Capabilities()
    by_default: bool = True  # False: opt-in, run only when named with --impl

    @property
    def key(self) -> str:
        """What :func:`resolve` takes to rebuild this adapter in another process."""
        return self.name

    def mode_on(self, device: str) -> Optional[Mode]:
        """The mode a rank on ``device`` runs this implementation in, as the parent can tell before any rank
        answers (a record whose ranks all died or were cut off still names it); ranks report their own."""
        return self.mode

    def version(self) -> Optional[str]:
        return None

    def repro_binding(self) -> Optional[ReproBinding]:
        """How a short repro file imports this implementation, or None where it cannot stand alone."""
        return None

    def check_available(self) -> None:  # noqa: B027 - available unless an adapter says otherwise
        """Raise :class:`harness.errors.ImplUnavailable` with the reason if this cannot run here."""

    def check_available_on(self, device: str) -> None:
        """Like :meth:`check_available`, for one device (an adapter may need more on some devices)."""
        self.check_available()

    def unsupported_reason(self, case: Case, device: str) -> Optional[str]:
        """Why this implementation cannot run ``case`` on ``device``, or None."""
        cap = self.capabilities
        checks = [
            (device in cap.devices, f"device {device} (supports {', '.join(sorted(cap.devices))})"),
            (case.dtype in cap.dtypes, f"input dtype {case.dtype}"),
            (case.param_dtype in cap.param_dtypes, f"parameter dtype {case.param_dtype}"),
            (cap.mixed_dtypes or case.dtype == case.param_dtype,
             f"input dtype {case.dtype} with parameters in {case.param_dtype}"),
            (case.memory_format in cap.memory_formats, f"memory format {case.memory_format}"),
            (case.ndim in cap.ndims, f"{case.ndim}-D input"),
            (cap.subgroups or not case.groups, "process subgroups"),
            (cap.momentum_none or case.momentum is not None, "momentum=None"),
            (cap.affine_off or case.affine, "affine=False"),
            (cap.no_running_stats or case.track_running_stats, "track_running_stats=False"),
            (cap.empty_ranks or min(case.batch_sizes) > 0, "an empty batch on a rank"),
            (cap.convert or not case.model, "conversion of a whole model"),
            (cap.fullgraph or "fullgraph" not in case.compile, "torch.compile(fullgraph=True)"),
            (cap.double_backward or case.use != "double-backward", "double backward (create_graph=True)"),
            (cap.script or case.use != "script", "torch.jit.script"),
            (cap.bias_off or case.bias, "bias=False (a weight without a bias)"),
            (cap.factory_kwargs or case.setup != "factory", "the constructor's device= and dtype= keywords"),
            (cap.revert or case.scenario != "revert", "reverting a converted model to BatchNorm (it has no revert)"),
        ]
        missing = [what for ok, what in checks if not ok]
        if missing:
            return f"{self.name} does not support " + "; ".join(missing)
        return None

    def setup_rank(self, device: str) -> None:  # noqa: B027 - most adapters need no preparation
        """Prepare a rank process once, before its first case (e.g. load kernels)."""

    @abc.abstractmethod
    def build(self, case: Case, process_group, device: str):
        """Return one ``nn.Module`` for this rank, with ``torch.nn.SyncBatchNorm``'s semantics."""

    def convert(self, model, process_group):
        """Convert every BatchNorm of ``model`` to this implementation (``convert_sync_batchnorm``)."""
        raise ImplUnavailable(f"{self.name} has no model conversion (its capabilities say convert=False)")

    def revert(self, model):
        """Turn every SyncBN layer of ``model`` back into a BatchNorm with this implementation's own revert."""
        raise ImplUnavailable(f"{self.name} has no revert to BatchNorm (its capabilities say revert=False)")

    def private_ops(self):
        """Where this implementation keeps ops with the contract of torch's five private SyncBN ops
        (``batch_norm_stats``, ``batch_norm_gather_stats_with_counts``, ``batch_norm_elemt``,
        ``batch_norm_backward_reduce``, ``batch_norm_backward_elemt``: :mod:`harness.judge.private_ops`), as an
        object with the ops as attributes, called in a rank process after :meth:`setup_rank`; None (most
        implementations): it has none, and the ``private_ops`` scenario's cases are ``unsupported``."""
        return None

    def forward(self, module, input):
        """Call the module, or a whole model containing it (adapters may wrap the call, e.g. in a context)."""
        return module(input)

    def shipped(self, model):
        """A context in which the layers of ``model`` run as the implementation ships them, with nothing of the
        harness answering for them (torch's cpu-emulation undone for the block, see
        :meth:`harness.impls.torch_native.TorchImpl.shipped`): inference on CPU judges the layers a user's
        inference process has. Most adapters add nothing to their layers: an empty context."""
        return contextlib.nullcontext()

    def before_compile(self) -> None:  # noqa: B027 - most adapters have nothing to hide from dynamo
        """Called in a rank process before a case is compiled: hide adapter Python that only ever runs
        eagerly (kernels registered from Python) from dynamo, which would otherwise compile it too."""

    def ddp_guard(self):
        """A context in which ``DistributedDataParallel`` may wrap a model of this implementation's layers."""
        return contextlib.nullcontext()

    ddp_note: Optional[str] = None  # what ddp_guard changed in the task now running (the rank resets it per task)

    def describe(self) -> dict:
        """Name, mode, version, availability and capabilities, for ``list impls``."""
        try:
            self.check_available()
            state, reason = "available", None
        except Exception as exc:  # noqa: BLE001 - any failure to load is the reason it is unavailable
            state, reason = "unavailable", str(exc)
        mode = mode_words.text(self.mode, self.mode_notes) or None
        return {"name": self.name, "state": state, "reason": reason, "mode": mode,
                "version": _safe(self.version), **self.capabilities.to_dict()}


def _safe(fn):
    try:
        return fn()
    except Exception:  # noqa: BLE001 - a version we cannot read is reported as unknown
        return None
