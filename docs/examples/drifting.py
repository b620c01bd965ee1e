"""A plugin for the gate example (README.md, docs/ci-gating.md): one implementation, two "builds".

It is the harness's reference SyncBatchNorm with its output scaled by 1 + $SYNCBN_DRIFT (0 when unset),
so the same name stands for a good build (no drift) and a build made worse (SYNCBN_DRIFT=0.01):

    PYTHONPATH=docs/examples syncbn-harness run --impl drifting:SyncBatchNorm ...
"""

import os

from harness.impls.reference import SyncBatchNorm as Reference


class SyncBatchNorm(Reference):
    def forward(self, input):
        out = super().forward(input)
        drift = float(os.environ.get("SYNCBN_DRIFT", "0"))
        return out * (1.0 + drift) if drift else out
