"""Adapter for ``torch.nn.SyncBatchNorm``: native on CUDA, torch's own code over our kernels on CPU.

On CPU the mode is ``cpu-emulation`` (see :mod:`harness.emulation` for exactly
which parts are torch's and which are ours).
"""

from __future__ import annotations

from harness.case import Case
from harness.impls import Capabilities, Impl, register


@register("torch")
class TorchImpl(Impl):
    mode = "native"
    capabilities = Capabilities(convert=True)

    def version(self) -> str:
        import torch

        return torch.__version__

    def check_available_on(self, device: str) -> None:
        if device == "cpu":
            from harness import emulation
            from harness.errors import ImplUnavailable

            reason = emulation.unavailable_reason()
            if reason:
                raise ImplUnavailable(f"torch cpu-emulation unavailable: {reason}")

    def setup_rank(self, device: str) -> None:
        if device == "cpu":
            from harness import emulation

            emulation.install()
            self.mode = "cpu-emulation"
            self.path = emulation.device_check_path()

    def describe(self) -> dict:
        from harness import emulation

        d = super().describe()
        d["mode"] = "native on cuda, cpu-emulation on cpu"
        d["cpu_path"] = emulation.device_check_path()
        return d

    def build(self, case: Case, process_group, device: str):
        import torch

        cls = torch.nn.SyncBatchNorm
        if device == "cpu" and getattr(self, "path", "module") == "function":
            from harness.emulation import FunctionDriven

            cls = FunctionDriven
        return cls(case.channels, eps=case.eps, momentum=case.momentum, affine=case.affine,
                   track_running_stats=case.track_running_stats, process_group=process_group)

    def convert(self, model, process_group):
        import torch

        converted = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model, process_group)
        if getattr(self, "path", "module") == "function":
            from harness.emulation import FunctionDriven

            for m in converted.modules():
                if type(m) is torch.nn.SyncBatchNorm:
                    m.__class__ = FunctionDriven  # same state; forward drives torch's Function directly
        return converted

    def forward(self, module, input):
        if input.device.type == "cpu" and getattr(self, "path", None) == "module":
            from harness.emulation import privateuse1_answers_cpu

            with privateuse1_answers_cpu():
                return module(input)
        return module(input)
