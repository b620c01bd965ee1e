"""Adapter for ``torch.nn.SyncBatchNorm``: native on CUDA, torch's own code over our kernels on CPU.

On CPU the mode is ``cpu-emulation`` (see :mod:`harness.impls.torch_emulation`
for exactly which parts are torch's and which are ours), except in a process
without a process group (``Case.backend == "no-group"``), where torch's layer
never synchronizes and runs as shipped (mode ``native``). Inference judged as
shipped (:meth:`TorchImpl.shipped`) undoes the emulation's answer to the
device check for its block.

On both devices, a case whose dtypes torch's CUDA kernels refuse, as
``nn.BatchNorm`` on CUDA does too (float32 input with float64 parameters: the
gather reads the running statistics' dtype), is ``unsupported``, with the op and
CUDA's error, as :mod:`harness.impls.cuda_contract` derives it from the
contract. A refusal ``nn.BatchNorm`` does not make runs, and fails as on CUDA.
A case without bias (``bias=False``) is ``unsupported`` on a build whose
SyncBatchNorm predates that keyword. torch has no revert of SyncBatchNorm to
BatchNorm (pytorch#41081 asks for one): its revert cases are ``unsupported``.
"""

from __future__ import annotations

from typing import Optional

from harness.catalog.case import Case
from harness.impls.base import (Capabilities, Impl, ReproBinding, construct_like_syncbn, takes_bias,
                                takes_keywords)
from harness.judge.mode import Mode


class TorchImpl(Impl):
    """``torch.nn.SyncBatchNorm`` and its ``convert_sync_batchnorm``."""

    name = "torch"
    mode = Mode.NATIVE
    path = "module"  # how the CPU emulation gets past the module's device check (set per rank)
    capabilities = Capabilities(convert=True)

    def version(self) -> str:
        import torch

        return torch.__version__

    def mode_on(self, device: str) -> Optional[Mode]:
        return Mode.CPU_EMULATION if device == "cpu" else Mode.NATIVE

    def unsupported_reason(self, case: Case, device: str) -> Optional[str]:
        """The capabilities' reason, else why CUDA's kernels refuse torch's SyncBN on ``case`` (either device)."""
        reason = super().unsupported_reason(case, device) or self.no_bias_reason(case) or self.no_factory_reason(case)
        if reason or case.op:  # one of torch's ops called directly (private_ops): the module's calls are not made
            return reason
        from harness.impls import cuda_plan

        return cuda_plan.syncbn_unsupported_reason(case, device)

    def no_bias_reason(self, case: Case) -> Optional[str]:
        """Why this build's SyncBatchNorm cannot run a case without bias (it predates the keyword), or None."""
        if case.bias or takes_bias(self.syncbn_class()):
            return None
        import torch

        return (f"torch {torch.__version__}'s SyncBatchNorm takes no bias argument (BatchNorm's bias=False came "
                "with pytorch#176573)")

    def no_factory_reason(self, case: Case) -> Optional[str]:
        """Why this build's SyncBatchNorm cannot be built in place (no ``device=``/``dtype=``), or None."""
        if case.setup != "factory" or takes_keywords(self.syncbn_class(), ("device", "dtype")):
            return None
        import torch

        return (f"torch {torch.__version__}'s SyncBatchNorm takes no device= and dtype= arguments (they came with "
                "pytorch#54508, 1.9)")

    def repro_binding(self) -> ReproBinding:
        return ReproBinding("torch", "SyncBatchNorm = torch.nn.SyncBatchNorm", on_cuda=True)

    def check_available_on(self, device: str) -> None:
        if device == "cpu":
            from harness.errors import ImplUnavailable
            from harness.impls import torch_emulation

            reason = torch_emulation.unavailable_reason()
            if reason:
                raise ImplUnavailable(f"torch cpu-emulation unavailable: {reason}")

    def syncbn_class(self):
        """The SyncBatchNorm class this adapter runs (torch's own; a patched copy for ``torch@PATH``)."""
        import torch

        return torch.nn.SyncBatchNorm

    def setup_rank(self, device: str) -> None:
        """On CPU in a process with a process group: cpu-emulation. Without one (a ``no-group`` pool) torch's layer
        never synchronizes and runs natively, as shipped (``F.batch_norm`` on CPU), so nothing is installed."""
        if device == "cpu" and _grouped():
            from harness.impls import torch_emulation

            torch_emulation.install()
            self.mode = Mode.CPU_EMULATION
            self.path = torch_emulation.device_check_path(self.syncbn_class())
            if self.path == "module":
                torch_emulation.accept_cpu_in_module(self.syncbn_class())

    def describe(self) -> dict:
        from harness.impls import torch_emulation

        d = super().describe()
        d["mode"] = "native on cuda, cpu-emulation on cpu"
        d["cpu_path"] = torch_emulation.device_check_path()
        return d

    def private_ops(self):
        """torch's own ops (``torch.batch_norm_stats``, ...): CUDA's kernels, or the cpu-emulation's on CPU."""
        import torch

        return torch

    def build(self, case: Case, process_group, device: str):
        cls = self.syncbn_class()
        if device == "cpu" and self.path == "function":
            from harness.impls.torch_emulation import FunctionDriven

            cls = FunctionDriven
        return construct_like_syncbn(cls, case, process_group, device)

    def converter(self):
        """The function that converts a model (an adapter over torch's layers may bring its own)."""
        return self.syncbn_class().convert_sync_batchnorm

    def convert(self, model, process_group):
        import torch

        converted = self.converter()(model, process_group)
        if self.path == "function":
            from harness.impls.torch_emulation import FunctionDriven

            for m in converted.modules():
                if type(m) is torch.nn.SyncBatchNorm:
                    m.__class__ = FunctionDriven  # same state; forward drives torch's Function directly
        return converted

    def shipped(self, model):
        """In cpu-emulation, torch's layers of ``model`` as torch ships them for the block: the class's own
        ``forward`` (its device check unanswered) and, on the function path, torch's class instead of
        :class:`~harness.impls.torch_emulation.FunctionDriven`. Natively there is nothing to undo."""
        if self.mode is not Mode.CPU_EMULATION:
            return super().shipped(model)
        from harness.impls import torch_emulation

        return torch_emulation.as_shipped(self.syncbn_class(), model)

    def before_compile(self) -> None:
        """In cpu-emulation, the Python CPU kernels of the five ATen ops are skipped by dynamo (a GPU's are C++)."""
        if self.mode is Mode.CPU_EMULATION:
            from harness.impls import torch_emulation

            torch_emulation.hide_kernels_from_dynamo()

    def ddp_guard(self):
        """In cpu-emulation, DDP's refusal of SyncBatchNorm in CPU modules is skipped while it wraps the model."""
        if self.mode is Mode.CPU_EMULATION:
            from harness.impls import torch_emulation

            self.ddp_note = "DDP's CPU SyncBatchNorm check skipped"
            return torch_emulation.ddp_accepts_cpu_syncbn()
        return super().ddp_guard()


def _grouped() -> bool:
    """Whether this process has a process group (``torch.distributed`` initialized)."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()
