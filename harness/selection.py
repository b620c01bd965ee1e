"""What a command runs: the one :class:`Selection` behind ``--impl``, ``--case``, ``--exhaustive``, ...

Every command that runs cases (``run``, ``check``, ``gate``, ``bisect``,
``bisect-script``, ``repro``, ``list cases``) and the pytest plugin of
``cases/`` build one ``Selection`` from the same flags and ask it for the
cases, the implementations and the run options; ``argv`` turns it back into
flags for a child process (a bisection's environments, a ``git bisect run``
script). Resolution is lazy: building a Selection imports neither torch nor
the catalog.

The case rule: ``--case GLOB`` picks the cases of the default selection whose
ID matches (of the full product with ``--exhaustive``); a pattern without
wildcards is an exact case ID and always selects that case, default or not.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Optional, Sequence

from harness.errors import UsageError

DEFAULT_TIMEOUT_S = 120.0
DEVICES = ("cpu", "cuda")
BACKENDS = ("gloo", "nccl", "nccl-contract", "list-contract")


@dataclass
class RunOptions:
    """How to run: device, backend, the per-case time limit, and an optional comparison."""

    device: str = "cpu"
    backend: Optional[str] = None
    timeout: float = DEFAULT_TIMEOUT_S
    # (A, B): A's records also say how A differs from B on the same inputs (``--compare A,B``).
    compare: Optional[tuple[str, str]] = None
    # An unexpected crash or hang is run once more with collective debugging (harness.engine.diagnosis).
    diagnose: bool = True

    @property
    def resolved_backend(self) -> str:
        return self.backend or ("nccl" if self.device == "cuda" else "gloo")


def default_device() -> str:
    """cuda when torch sees a GPU here, else cpu."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass(frozen=True)
class Selection:
    """The selection flags, as given; resolved on demand into cases, adapters and run options."""

    impls: tuple[str, ...] = ()
    case_patterns: tuple[str, ...] = ()
    exhaustive: bool = False
    device: Optional[str] = None
    backend: Optional[str] = None
    world_sizes: tuple[int, ...] = ()
    timeout: Optional[float] = None
    scenarios: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("impls", "case_patterns", "world_sizes", "scenarios"):
            object.__setattr__(self, name, tuple(getattr(self, name) or ()))
        if self.device is not None and self.device not in DEVICES:
            raise UsageError(f"--device {self.device!r}: choose one of {', '.join(DEVICES)}")
        if self.backend is not None and self.backend not in BACKENDS:
            raise UsageError(f"--backend {self.backend!r}: choose one of {', '.join(BACKENDS)}")
        if self.device == "cpu" and self.backend == "nccl":
            raise UsageError("--backend nccl needs --device cuda: on CPU use --backend gloo, or --backend "
                             "nccl-contract for torch's non-gloo code path")

    @cached_property
    def resolved_device(self) -> str:
        return self.device or default_device()

    @property
    def resolved_backend(self) -> str:
        return self.backend or ("nccl" if self.resolved_device == "cuda" else "gloo")

    @cached_property
    def cases(self) -> list:
        """The selected cases, in catalog order (a pattern that matches nothing is a usage error)."""
        from harness import catalog

        return catalog.select(self.case_patterns, exhaustive=self.exhaustive, world_sizes=self.world_sizes,
                              scenarios=self.scenarios)

    @property
    def impl_names(self) -> list[str]:
        """The implementations asked for, or every built-in one a run takes by default."""
        from harness.impls import default_names

        return list(self.impls) or default_names()

    def resolve_impls(self, extra: Sequence[str] = ()) -> list:
        """Adapters for the selected names (plus ``extra``); a plugin that cannot be imported is an error."""
        from harness.impls import resolve_impls

        names = self.impl_names + [n for n in extra if n not in self.impl_names]
        return resolve_impls(names)

    def run_options(self, **overrides):
        """The :class:`RunOptions` these flags ask for."""
        opts = {"device": self.resolved_device, "backend": self.resolved_backend,
                "timeout": self.timeout or DEFAULT_TIMEOUT_S}
        opts.update(overrides)
        return RunOptions(**opts)

    def argv(self) -> list[str]:
        """The flags as ``run``/``check`` take them (for a child process)."""
        out: list[str] = []
        for i in self.impls:
            out += ["--impl", i]
        for c in self.case_patterns:
            out += ["--case", c]
        if self.exhaustive:
            out.append("--exhaustive")
        if self.device:
            out += ["--device", self.device]
        if self.backend:
            out += ["--backend", self.backend]
        for w in self.world_sizes:
            out += ["--world-size", str(w)]
        for s in self.scenarios:
            out += ["--scenario", s]
        if self.timeout:
            out += ["--timeout", f"{self.timeout:g}"]
        return out
