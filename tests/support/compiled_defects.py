"""SyncBNs that are correct eagerly and wrong only where torch.compile traces them.

``torch.compiler.is_compiling()`` is True only while dynamo traces, so the
extra arithmetic below lands in the compiled graphs and never runs eagerly:
the eager pass of a compiled case is exact, the compiled pass is not.

- :class:`NudgedWhenCompiled`: the output scaled by (1 + 2**-20), far inside
  the oracle's float32 tolerance: only the bitwise comparison with the eager
  run (backend ``eager``) can see it;
- :class:`ShiftedWhenCompiled`: the output moved by a tenth of its scale:
  the oracle sees it whatever the backend.
"""

from __future__ import annotations

import torch

from harness.impls.reference import SyncBatchNorm


class NudgedWhenCompiled(SyncBatchNorm):
    def forward(self, input):
        out = super().forward(input)
        if torch.compiler.is_compiling():
            out = out * (1 + 2**-20)
        return out


class ShiftedWhenCompiled(SyncBatchNorm):
    def forward(self, input):
        out = super().forward(input)
        if torch.compiler.is_compiling():
            out = out + 0.1
        return out
