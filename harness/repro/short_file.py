"""What a short repro file states (:class:`ShortFile`), and how its text is chosen and joined.

:meth:`ShortFile.render` joins a docstring, the case's constants (each with
a comment a maintainer can read) and the literal blocks of
:mod:`harness.repro.short_text`, filling their ``@@NAME@@`` markers. A block
appears only where the case needs it, so a plain case reads plainly; the only
generated text is the docstring, the constants and the one line that says
which quantity is observed. :func:`harness.repro.short.source` builds the
:class:`ShortFile` from a case, its target and its symptom.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Optional

from harness.catalog.case import Case
from harness.repro.short_text import (BN_CLASS, CHECK_ACROSS, CHECK_ASPECT, CHECK_ONE, CHECK_VALUE, CPU_STAND_INS,
                                      CUDA_DEVICE, CUDA_ONLY_DEVICE, DATA, FORWARD, FORWARD_NOGRAD, GROUPS_BLOCK,
                                      HOSTILE, IMPORTS, MAIN, NEEDS_GPU, NORMALS, OBSERVE, OBSERVE_DEF,
                                      PER_RANK_GENERATORS, RANK, RANK0, START, TOGETHER, TOGETHER_OWN, TOLERANCE,
                                      TOTAL, WORLD_BLOCK)
from harness.repro.symptom import Aspect, Symptom
from harness.judge.status import Status


@dataclass(frozen=True)
class ShortFile:
    """Everything one short file says: its words, the case's constants, the symptom, where it runs."""

    title: str  # the docstring's first line
    story: str  # the docstring's paragraph (:func:`story`)
    seen: str  # where the symptom was seen
    library: str  # what a maintainer installs besides torch
    import_line: str  # the lines that bind ``SyncBatchNorm``
    channels: int
    spatial: list  # each rank's spatial size, as tuples
    step_sizes: list  # each step's batch size per rank
    steps: list  # the step kinds
    dtype: str  # ``torch.float32``
    param_dtype: str
    eps: float
    momentum: Optional[float]
    affine: bool
    track_running_stats: bool
    seed: int
    normals: str  # the dtype the standard normals are drawn in (a key of NORMALS)
    draws: str  # "per-rank": each rank's samples from a generator of its own
    rank_seeds: Optional[list]  # those generators' seeds
    ndim: int
    u_q: float  # unit roundoff of the quantity's dtype
    u_acc: float  # unit roundoff of the accumulation type
    groups: Optional[list]  # process subgroups, as lists of ranks
    fmt: Optional[str]  # the input's memory format (``torch.channels_last``), None: contiguous
    gfmt: Optional[str]  # the upstream gradient's
    input_mean: float
    input_scale: float
    constant: list  # constant channels
    symptom: Symptom
    cuda: bool  # the layer runs on CUDA where there is a GPU
    stand_ins: bool  # without one, over the CPU stand-ins for torch's CUDA ops (False with cuda: a GPU is needed)
    # (only in a CPU demonstration, which says it is one: stand-ins are never evidence of what CUDA does)

    @property
    def hostile(self) -> bool:
        """Inputs other than the plain draws: an offset, a scale, constant channels."""
        return self.input_mean != 0.0 or self.input_scale != 1.0 or bool(self.constant)

    def constants(self) -> str:
        """The case's constants, each with what it means."""
        sym = self.symptom
        lines = [f"C, SPATIAL = {self.channels}, {self.spatial!r}  # channels; each rank's spatial size",
                 f"STEP_SIZES = {self.step_sizes!r}  # each step's batch size per rank",
                 f"STEPS = {self.steps!r}  # train, eval: forward and backward; nograd: training forward, no_grad",
                 f"DTYPE, PARAM_DTYPE = {self.dtype}, {self.param_dtype}  # input; parameters and buffers",
                 f"LAYER = dict(eps={self.eps!r}, momentum={self.momentum!r}, "
                 f"affine={self.affine!r}, track_running_stats={self.track_running_stats!r})"]
        if self.groups:
            lines.append(f"GROUPS = {self.groups!r}  # process subgroups; each normalizes over its own ranks")
        if self.fmt or self.gfmt:
            lines.append(f"MEMORY_FORMAT, GRAD_MEMORY_FORMAT = {self.fmt or 'torch.contiguous_format'}, "
                         f"{self.gfmt or 'torch.contiguous_format'}")
        if self.hostile:
            lines.append(f"INPUT_MEAN, INPUT_SCALE, CONSTANT_CHANNELS = {self.input_mean!r}, {self.input_scale!r}, "
                         f"{self.constant!r}")
        lines += [f"SEED = {self.seed}",
                  f"SYMPTOM, QUANTITY, ERROR_TYPE = {sym.status.value!r}, {sym.quantity or 'output'!r}, "
                  f"{sym.exception_type!r}  # what shows the defect",
                  "# Tolerance: 16 unit roundoffs of the quantity's dtype, plus 16 of the accumulation type (float32;",
                  "# float64 for float64 input) x log2(values per channel) x the input's max|x| / sqrt(var + eps)",
                  f"U_Q, U_ACC = {self.u_q!r}, {self.u_acc!r}",
                  f"BN = torch.nn.{BN_CLASS[self.ndim]}"]
        return "\n".join(lines) + "\n"

    def data_block(self) -> str:
        """The ``data`` function: hostile inputs where the case has them, normals in the case's dtype, from one
        generator or (a case drawn per rank) each rank's samples from a generator of its own."""
        draw, widen, drawn = NORMALS[self.normals]
        gens, ranks = "", "n, sp in zip(sizes, SPATIAL)"
        if self.draws == "per-rank":
            draw = draw.replace("**f64)", "dtype=torch.float64, generator=g)").replace("generator=g)",
                                                                                     "generator=own[r])")
            drawn = drawn[:-1] + ",\n    each rank's by a generator of its own."
            gens = PER_RANK_GENERATORS.replace("@@RANK_SEEDS@@", repr(list(self.rank_seeds)))
            ranks = "r, (n, sp) in enumerate(zip(sizes, SPATIAL))"
        return (DATA.replace("@@HOSTILE@@", HOSTILE if self.hostile else "").replace("@@NORMALS@@", draw)
                .replace("@@WIDEN@@", widen).replace("@@DRAWN@@", drawn).replace("@@GENS@@", gens)
                .replace("@@RANKS@@", ranks))

    def check_block(self) -> str:
        """The ``check`` function for the symptom's aspect."""
        sym = self.symptom
        if sym.status is not Status.MISMATCH or sym.aspect is Aspect.VALUE:
            return CHECK_VALUE
        if sym.aspect is Aspect.ACROSS_RANKS:
            return CHECK_ACROSS
        cond, shown = CHECK_ASPECT[sym.aspect]
        dtype = "DTYPE" if sym.quantity in ("output", "grad_input") else "PARAM_DTYPE"
        return CHECK_ONE.replace("@@COND@@", cond.replace("@@DTYPE@@", dtype)).replace(
            "@@SHOWN@@", shown.replace("@@DTYPE@@", dtype))

    def docstring(self) -> list[str]:
        """The file's docstring, line by line (without its closing quotes)."""
        cuda, stand_ins = self.cuda, self.stand_ins
        needs = "torch" if self.library == "torch" else f"torch and {self.library}"
        if cuda and not stand_ins:
            needs = f"{needs} and a GPU ({self.library}'s kernels here are CUDA kernels)"
        title = self.title.rstrip(".")
        if cuda and stand_ins:
            title = f"CPU demonstration, not evidence of CUDA's behaviour: {title}"
        doc = [f'"""{title}.', "", self.story, "",
               *textwrap.wrap(f"Seen: {self.seen.rstrip('.')}.", 100, break_on_hyphens=False,
                              break_long_words=False),
               *textwrap.wrap(f"Needs only {needs}. Exit 1: the symptom shows; 0: it does not (fixed); 2: something "
                              "else failed.", 100, break_on_hyphens=False)]
        if cuda and stand_ins:
            doc += ["", "A CPU demonstration: without a GPU, torch's SyncBatchNorm runs here over plain-torch CPU",
                    "stand-ins for its five CUDA ops (stand_in_cuda_ops below). A symptom seen that way lives in",
                    "torch's Python code or in the stand-ins, never in CUDA's kernels: the evidence is the file",
                    "`syncbn-harness repro` writes without --cpu-demo, run on a GPU."]
        return doc

    def render(self) -> str:
        """The whole file (see the module docstring)."""
        sym, cuda, stand_ins = self.symptom, self.cuda, self.stand_ins
        device = ('"cuda" if torch.cuda.is_available() else "cpu"' if stand_ins else '"cuda"') if cuda else '"cpu"'
        backend = ('"nccl" if DEVICE == "cuda" and torch.cuda.device_count() >= len(SPATIAL) else "gloo"'
                   if cuda else '"gloo"')
        quantity = sym.quantity or "output"
        across = sym.status is Status.MISMATCH and sym.aspect is Aspect.ACROSS_RANKS
        gap = "\n\n" if "\ndef " in "\n" + self.import_line else ""  # two blank lines after a function
        parts = ["#!/usr/bin/env python3", "\n".join(self.docstring()) + '\n"""', IMPORTS,
                 "\n" + self.import_line + "\n\n",
                 gap + self.constants() + f"DEVICE = {device}\nBACKEND = {backend}\n{START[cuda]}\n",
                 self.data_block(), TOLERANCE,
                 OBSERVE_DEF.replace("@@OBSERVE@@", OBSERVE[quantity])]
        if quantity in ("grad_weight", "grad_bias"):
            parts.append(TOTAL)
        parts.append(self.check_block())
        if cuda and stand_ins:
            parts.append(CPU_STAND_INS)
        fmt, steps = self.fmt or self.gfmt, self.steps
        nograd = "nograd" in steps
        if nograd:
            parts[2] = "import contextlib\n" + parts[2]
        own = not self.track_running_stats and any(k not in ("train", "nograd") for k in steps)
        parts += [RANK.replace("@@DEVICE@@", (CUDA_DEVICE if stand_ins else CUDA_ONLY_DEVICE) if cuda else "")
                  .replace("@@RANK0@@", RANK0 if "eval-rank0" in steps else "")
                  .replace("@@FORWARD@@", FORWARD_NOGRAD if nograd else FORWARD)
                  .replace("@@TOGETHER@@", TOGETHER_OWN if own else TOGETHER)
                  .replace("@@GROUPS@@", GROUPS_BLOCK if self.groups else WORLD_BLOCK)
                  .replace("@@FMT@@", ".to(memory_format=MEMORY_FORMAT)" if fmt else "")
                  .replace("@@GFMT@@", ".to(memory_format=GRAD_MEMORY_FORMAT)" if fmt else "")
                  .replace("@@CHECK_GROUP@@", ", group, members" if across else ""),
                  MAIN.replace("@@NEEDS_GPU@@", NEEDS_GPU if cuda and not stand_ins else "")]
        return "\n".join(p.rstrip("\n") for p in parts) + "\n"


def story(case: Case, target, symptom) -> str:
    """The docstring's paragraph: who runs what on which data, compared with what."""
    sizes = ", ".join(str(s) for s in case.batch_sizes)
    where = ("on CUDA (see below without a GPU)" if target.on_cuda else "on CUDA" if target.cuda_only
             else "(gloo, CPU)")
    extras = [w for ok, w in [(case.memory_format != "contiguous", case.memory_format),
                              (case.momentum is None, "momentum=None"), (not case.affine, "affine=False"),
                              (not case.track_running_stats, "track_running_stats=False"),
                              (case.groups is not None, f"process groups {[list(g) for g in case.groups or ()]}"),
                              (case.input_mean != 0.0 or case.input_scale != 1.0,
                               f"inputs {case.input_mean:g} + {case.input_scale:g} x N(offset, spread)"),
                              (bool(case.constant_channels), f"constant channels {list(case.constant_channels)}")]
              if ok]
    layer = "torch.nn.SyncBatchNorm" if target.name == "torch" else target.name.replace(":", ".")
    words = (f"{case.world_size} processes {where} run {layer} ({case.channels} channels, "
             f"{case.dtype} input, {case.param_dtype} parameters{''.join(', ' + e for e in extras)}) on their "
             f"parts of one batch ({sizes} samples of spatial size {tuple(case.spatial[0])}; steps: "
             f"{', '.join(case.steps)}) and compare {symptom.quantity or 'the output'} with "
             f"torch.nn.{BN_CLASS[case.ndim]} over the whole batch in float64.")
    return "\n".join(textwrap.wrap(words, 100, break_on_hyphens=False, break_long_words=False))
