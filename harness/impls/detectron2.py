"""detectron2's ``NaiveSyncBatchNorm`` (``--impl detectron2``, ``--impl detectron2-n``; both opt-in).

Design: detectron2 is not on the package index. Its ``detectron2/layers/batch_norm.py``
is taken from an importable detectron2 (a checkout the user puts on
``PYTHONPATH``, or an installed build) when there is one, else from the PyPI
package ``detectron2-layers`` (an unofficial repackaging, made for SegGPT,
whose ``NaiveSyncBatchNorm`` is detectron2's class line for line; only the
world-size helper is its own copy of ``detectron2.utils.comm.get_world_size``).
The mode names which one ran. The class is its own code, not
``torch.nn.SyncBatchNorm``: a ``BatchNorm2d`` subclass that averages
``[mean, E[x^2]]`` over the default group with fvcore's
``differentiable_all_reduce`` in training and is plain ``BatchNorm2d`` in
eval, so no cpu-emulation is involved.

Its constructor is ``BatchNorm2d``'s plus ``stats_mode`` and has no process
group, so the adapter builds it itself (a ``MODULE:ATTR`` plugin would pass
``process_group``). Two adapters, one per ``stats_mode``, each declaring what
detectron2's docstring says the mode does not compute exactly as
``unsupported`` (so a search spends no time re-finding documented behaviour):

- ``detectron2``: ``stats_mode=""`` (the default, ``get_norm("naiveSyncBN")``)
  weights every rank equally: exact only when all ranks have the same (N, H,
  W), and it asserts on an empty batch;
- ``detectron2-n``: ``stats_mode="N"`` (``get_norm("naiveSyncBN_N")``)
  weights each rank by its batch size N: exact when all ranks with data have
  the same (H, W); empty batches are allowed.

Both: 4-D input only (a ``BatchNorm2d``), the whole world only (no subgroups),
no model conversion (detectron2 has no converter to it). The ``model``
scenario's networks (the ``ddp`` family, the ``training-loop`` and ``compile``
chains) build their norms with :meth:`build`, not a converter, so they run:
``Capabilities.convert`` counts every case with a model as a conversion.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from harness.catalog.case import Case
from harness.errors import ImplUnavailable
from harness.impls.base import Capabilities, Impl, ReproBinding, factory_keywords
from harness.judge.mode import Mode

INSTALL_HINT = ("pip install detectron2-layers (detectron2's layers on PyPI), or put a detectron2 checkout "
                "on PYTHONPATH (git clone https://github.com/facebookresearch/detectron2; its batch_norm.py "
                "needs fvcore: pip install fvcore)")


def locate():
    """``(module, where)``: detectron2's ``batch_norm`` module and what it came from; raises ImplUnavailable."""
    errors = []
    try:
        from detectron2.layers import batch_norm

        return batch_norm, "detectron2"
    except Exception as exc:  # noqa: BLE001 - not there, or a checkout whose compiled parts are missing
        errors.append(f"detectron2.layers: {type(exc).__name__}: {exc}")
    try:
        from detectron2_layers import batch_norm

        return batch_norm, "detectron2-layers"
    except Exception as exc:  # noqa: BLE001 - any failure to import is the reason
        errors.append(f"detectron2_layers: {type(exc).__name__}: {exc}")
    raise ImplUnavailable(f"detectron2's NaiveSyncBatchNorm is not importable ({'; '.join(errors)}): {INSTALL_HINT}")


def ranks_with_data(case: Case) -> list[int]:
    """The ranks that hold at least one sample in some step."""
    sizes = case.step_batch_sizes or (case.batch_sizes,)
    return [r for r in range(case.world_size) if any(step[r] > 0 for step in sizes)]


class Detectron2Impl(Impl):
    """``NaiveSyncBatchNorm(stats_mode="")``: every rank's statistics weighted equally."""

    name = "detectron2"
    by_default = False
    stats_mode = ""
    # bias_off: its training forward computes ``self.bias - mean * scale`` (it predates BatchNorm's bias=False).
    capabilities = Capabilities(ndims=frozenset({4}), subgroups=False, empty_ranks=False, bias_off=False)

    @property
    def mode(self) -> Optional[Mode]:  # type: ignore[override]
        try:
            locate()
        except ImplUnavailable:
            return None
        return Mode.NATIVE  # its own Python over torch's ops, on the device the record names

    @property
    def mode_notes(self) -> tuple[str, ...]:  # type: ignore[override]
        try:
            return f"stats_mode={self.stats_mode!r}", f"from {locate()[1]}"
        except ImplUnavailable:
            return ()

    def version(self) -> str:
        from importlib.metadata import version

        import torch

        where = locate()[1]
        if where == "detectron2":
            import detectron2

            got = f"detectron2 {getattr(detectron2, '__version__', '?')}"
        else:
            got = f"detectron2-layers {version('detectron2-layers')}"
        return f"{got}, fvcore {version('fvcore')}, on torch {torch.__version__}"

    def check_available(self) -> None:
        locate()

    def repro_binding(self) -> ReproBinding:
        """A standalone file binds ``SyncBatchNorm`` to this class and stats_mode (no process group, as here)."""
        module = "detectron2.layers.batch_norm" if locate()[1] == "detectron2" else "detectron2_layers.batch_norm"
        code = (f"from {module} import NaiveSyncBatchNorm\n\n\n"
                "def SyncBatchNorm(num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,\n"
                "                  process_group=None):\n"
                "    assert process_group is None, 'NaiveSyncBatchNorm reduces over the default group'\n"
                "    return NaiveSyncBatchNorm(num_features, eps=eps, momentum=momentum, affine=affine,\n"
                "                              track_running_stats=track_running_stats, "
                f"stats_mode={self.stats_mode!r})")
        return ReproBinding(module.split(".")[0].replace("_", "-"), code, on_cuda=False)

    def unsupported_reason(self, case: Case, device: str) -> Optional[str]:
        if case.scenario == "model":  # a network whose norms come from build() (DDP, training loops): no conversion
            case = dataclasses.replace(case, model=None)
        reason = super().unsupported_reason(case, device)
        if reason:
            return reason
        return self.documented_inexact(case)

    def documented_inexact(self, case: Case) -> Optional[str]:
        """What detectron2's docstring says this stats_mode does not compute as one big batch would."""
        sizes = case.step_batch_sizes or (case.batch_sizes,)
        counts = {b * _numel(case.spatial[r]) for step in sizes for r, b in enumerate(step)}
        if len(counts) > 1:
            return (f"{self.name} (stats_mode=\"\") weights every rank equally, documented as exact only when "
                    "all ranks have the same (N, H, W); this case's ranks differ (use detectron2-n for uneven N)")
        return None

    def build(self, case: Case, process_group, device: str):
        if process_group is not None:
            raise ImplUnavailable(f"{self.name}: NaiveSyncBatchNorm reduces over the whole default group and "
                                  "takes no process group; this case needs one (it should be unsupported)")
        cls = locate()[0].NaiveSyncBatchNorm
        return cls(case.channels, eps=case.eps, momentum=case.momentum, affine=case.affine,
                   track_running_stats=case.track_running_stats, stats_mode=self.stats_mode,
                   **factory_keywords(case, device))


class Detectron2NImpl(Detectron2Impl):
    """``NaiveSyncBatchNorm(stats_mode="N")``: every rank's statistics weighted by its batch size."""

    name = "detectron2-n"
    stats_mode = "N"
    capabilities = Capabilities(ndims=frozenset({4}), subgroups=False, bias_off=False)

    def documented_inexact(self, case: Case) -> Optional[str]:
        shapes = {tuple(case.spatial[r]) for r in ranks_with_data(case)}
        if len(shapes) > 1:
            return (f"{self.name} (stats_mode=\"N\") weights each rank by its batch size N, documented as exact "
                    f"only when all ranks have the same (H, W); this case's ranks have {sorted(shapes)}")
        return None


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
