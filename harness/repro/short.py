"""The issue-ready repro: a short standalone file that shows one symptom of one case.

What a maintainer receives: one Python file of about a hundred lines that
needs nothing but torch and the library under test. It starts the ranks
itself (forked on CPU, spawned on CUDA; gloo on CPU; torch's own layer runs on
CUDA, over nccl when there is a GPU per rank and over gloo otherwise), makes
the case's inputs from its seed in a few lines (the same draws as the
harness's, so the same numbers), runs
the layer step by step, and compares the one quantity the finding names with
``torch.nn.BatchNorm{1,2,3}d`` run in float64 over the whole batch (the
group's inputs concatenated), printing expected against actual. It exits 1
when the symptom shows, 0 when it does not (fixed), 2 when something else went
wrong (another exception, no GPU where one is required).

The tolerance is stated in the file and printed with each comparison:
normwise relative error (``max|actual - expected| / max|expected|``) within
16 unit roundoffs of the quantity's dtype plus 16 of the accumulation type
(float32, or float64 for float64 input) times log2 of the values reduced per
channel times the input's conditioning ``max|x| / sqrt(var + eps)``. A
correct float32 SyncBN of any reduction order is far inside it; a symptom
that stays inside it (an error of a few units in the last place) is not shown
by the short form, and :func:`verify` says so.

torch's ``torch.nn.SyncBatchNorm`` refuses CPU tensors, and its five
``batch_norm_*`` ops have CUDA kernels only: torch's file runs on CUDA only
(:meth:`Target.gpu_only`) and, without a GPU, says it needs one and exits 2.
Stand-ins for CUDA's kernels are never evidence of what CUDA does. A CPU
demonstration (``repro --cpu-demo``, ``demo=True``) is a separate file that
says it is one in its first line: it registers plain-torch stand-ins for the
five ops (:data:`harness.repro.short_text.CPU_STAND_INS`, statistics in
float32 as CUDA keeps them), so a symptom shown that way lives in torch's
Python code or in the stand-ins.

:func:`unexpressible` lists what the short form cannot state (a case that
converts a model, compiles, uses torch's non-gloo path, views its input in no
memory format, runs two forwards before one backward; the reference
implementation, which needs the harness); ``repro --long`` writes the
generated form for those.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from harness.catalog.case import STEP_KINDS, Case
from harness.catalog.dtypes import ROUNDOFF_OF
from harness.repro.short_file import ShortFile, story
from harness.repro.symptom import Symptom
from harness.judge.status import Status

FILE_STEPS = ("train", "eval", "nograd", "eval-rank0")


@dataclass(frozen=True)
class Target:
    """The library under test as the file imports it: ``import_line`` binds ``SyncBatchNorm``."""

    name: str  # as the harness names it (``torch``, ``MODULE:ATTR``)
    library: str  # the top-level package a maintainer installs
    import_line: str
    on_cuda: bool  # torch's layer: CUDA when there is one, else the CPU stand-ins (a demonstration only)
    cuda_only: bool = False  # kernels that exist on CUDA only (apex's optimized extension): the file needs a GPU

    def gpu_only(self) -> "Target":
        """This target on CUDA only: torch's layer without the CPU stand-ins (for a symptom seen on a GPU)."""
        return replace(self, on_cuda=False, cuda_only=True) if self.on_cuda else self

    @classmethod
    def of(cls, impl) -> Optional["Target"]:
        """The target for the adapter ``impl`` (its :meth:`~harness.impls.base.Impl.repro_binding`), or None."""
        binding = impl.repro_binding()
        if binding is None:
            return None
        return cls(impl.name, binding.library, binding.code, binding.on_cuda, binding.cuda_only)


def unexpressible(case: Case, impl) -> Optional[str]:
    """Why the short form cannot reproduce ``case`` for the adapter ``impl``, or None."""
    if impl.repro_binding() is None:
        return (f"{impl.name} cannot be imported by a standalone file (the reference needs the harness's kernels; "
                "a converter's cases convert whole models)")
    if case.scenario != "layer" or case.model:
        return f"the short form runs one layer; this case's scenario is {case.model or case.scenario!r}"
    reasons = [(bool(case.compile), "torch.compile"), (case.backend is not None, f"the {case.backend} backend"),
               (case.input_layout != "dense", f"a {case.input_layout} input view"),
               (len({tuple(sp) for sp in case.spatial}) > 1, "spatial sizes that differ between ranks"),
               (case.grad_mean != 0.0 or case.grad_scale != 1.0, "upstream gradients scaled or shifted"),
               (any(k not in FILE_STEPS for k in case.steps), "two forwards before one backward ('fwd' steps)"),
               (impl.name == "apex" and case.memory_format != "contiguous", "apex's channels-last layer"),
               (not case.bias, "a layer without bias (bias=False)"),
               (case.setup != "copied", f"a layer made ready otherwise than by copying ({case.setup})")]
    said = [why for bad, why in reasons if bad]
    if said:
        return "the short form does not cover " + ", ".join(said)
    for s, kind in enumerate(case.steps):
        if STEP_KINDS[kind] == "train" or not case.track_running_stats:
            for g in case.groups or (tuple(range(case.world_size)),):
                count = sum(case.sizes_at(s)[r] * math.prod(case.spatial[r]) for r in g)
                if count < 2 and STEP_KINDS[kind] == "train":
                    return (f"step {s} normalizes {count} value(s) per channel over group {list(g)}: "
                            "torch.nn.BatchNorm refuses that in training, so it cannot be the expectation")
    return None


def tolerance_terms(case: Case, quantity: str) -> tuple[float, float]:
    """(unit roundoff of the quantity's dtype, of the accumulation type) for the file's tolerance."""
    stored = case.dtype if quantity in ("output", "grad_input") else case.param_dtype
    acc = "float64" if case.dtype == "float64" else "float32"
    return ROUNDOFF_OF[stored], ROUNDOFF_OF[acc]


def source(case: Case, target: Target, symptom: Symptom, *, seen: str, title: str = "") -> str:
    """The text of the short file for ``case`` run with ``target``, checking ``symptom``.

    ``seen``: one line naming the builds the symptom was observed on (and whether on CUDA or only in
    cpu-emulation); ``title``: the first docstring line (default: the symptom in words). A ``target`` on CUDA
    with CPU stand-ins (``on_cuda``) gives the CPU demonstration, which says so; :meth:`Target.gpu_only` the
    file that is evidence.
    """
    if symptom.status is Status.MISMATCH and symptom.step is not None:
        # The steps after the first one that shows the symptom change nothing about it.
        case = replace(case, steps=case.steps[:symptom.step + 1],
                       step_batch_sizes=case.step_batch_sizes[:symptom.step + 1] if case.step_batch_sizes else None)
    u_q, u_acc = tolerance_terms(case, symptom.quantity or "output")
    fmt = {"contiguous": None, "channels_last": "torch.channels_last",
           "channels_last_3d": "torch.channels_last_3d"}
    file = ShortFile(
        title=title or f"{target.name.replace(':', '.')}: {symptom.describe()}",
        story=story(case, target, symptom), seen=seen, library=target.library,
        import_line=target.import_line, channels=case.channels, spatial=[tuple(s) for s in case.spatial],
        step_sizes=[list(case.sizes_at(s)) for s in range(len(case.steps))], steps=list(case.steps),
        dtype=f"torch.{case.dtype}", param_dtype=f"torch.{case.param_dtype}", eps=case.eps,
        momentum=case.momentum, affine=case.affine, track_running_stats=case.track_running_stats,
        seed=case.seed, normals=case.normals, draws=case.draws,
        rank_seeds=case.seeds_of_ranks() if case.draws == "per-rank" else None, ndim=case.ndim, u_q=u_q, u_acc=u_acc,
        groups=[list(g) for g in case.groups] if case.groups else None,
        fmt=fmt[case.memory_format], gfmt=fmt[case.grad_memory_format or case.memory_format],
        input_mean=case.input_mean, input_scale=case.input_scale, constant=list(case.constant_channels),
        symptom=symptom, cuda=target.on_cuda or target.cuda_only, stand_ins=target.on_cuda)
    body = file.render()
    compile(body, "repro.py", "exec")
    return body


def verify(path: Path, *, timeout: float = 600.0, env: Optional[dict] = None) -> subprocess.CompletedProcess:
    """Run the written file with this Python, as a maintainer would (``python FILE``), bounded by ``timeout``.

    Its temporary files go to a folder removed afterwards: torch's ``start_processes`` leaves an error file
    (``pytorch-errorfile-*.pickle``) in the temporary folder for every rank that raised, which is the symptom
    of many findings."""
    path = Path(path).resolve()  # run from its own folder: a relative path would name it twice
    with tempfile.TemporaryDirectory(prefix="syncbn-verify-") as tmp:
        return subprocess.run([sys.executable, path.name], capture_output=True, text=True, timeout=timeout,
                              cwd=path.parent, env={**os.environ, "TMPDIR": tmp, **(env or {})})
