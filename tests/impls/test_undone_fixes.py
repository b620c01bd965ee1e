"""cpu-emulation catches torch's SyncBatchNorm with an upstream fix undone, as CUDA would.

Design: the plugins of tests/support/undone_fixes.py are torch 2.13's own Function with one change each (the
empty-input branch of pytorch#74944 undone; the zero-count mask of pytorch#78656 undone), run through the real
engine beside torch itself on three empty-rank cases: a contiguous 4-D input, a channels_last_3d one with the empty
rank in the middle, a channels_last 4-D one. torch passes; each undone fix fails with what CUDA's kernels do
(tests/impls/test_cuda_arith.py checks those against a GPU): ``batch_norm_stats`` cannot reshape an empty
contiguous input, a channels-last launch over an empty input is refused, a zero row merged by the gather is NaN.

Before the emulation did CUDA's arithmetic (harness/impls/cuda_arith.py), with the reference's float64 kernels
standing in, all six of these records passed, and so did every float32 and float64 empty-rank case of the default
selection (11 per plugin, measured over a checkout of 9f12c64; the half and bfloat16 ones crash on the known
dtype defect either way).
"""

from __future__ import annotations

import pytest

from harness import catalog
from harness.engine.session import RunOptions, resolve_impls, run_selection
from harness.judge.status import Status

CASES = ["allgather-shape/empty-0-5/float32-float32/contiguous/ws2",
         "allgather-shape/empty-3-0-2/float32-float32/channels_last_3d/ws3",
         "channels-last/empty-rank/channels_last/ws2"]
EMPTY_BRANCH = "undone_fixes:EmptyBranchUndone"
ZERO_MASK = "undone_fixes:ZeroCountMaskUndone"


@pytest.mark.slow(10)
@pytest.mark.usefixtures("support_on_path")
def test_each_undone_fix_fails_where_torch_passes():
    impls = resolve_impls(["torch", EMPTY_BRANCH, ZERO_MASK])
    records = {(r.impl, r.case): r for r in run_selection(catalog.select(CASES), impls, RunOptions(timeout=120))}
    names = {spec: impl.name for spec, impl in zip(["torch", EMPTY_BRANCH, ZERO_MASK], impls)}
    for case in CASES:
        torch_record = records[(names["torch"], case)]
        assert torch_record.status is Status.PASS, (case, torch_record.message)
        empty = records[(names[EMPTY_BRANCH], case)]
        want = "cannot reshape tensor of 0 elements" if "/contiguous/" in case else "CUDA error: invalid argument"
        assert empty.status is Status.ERROR and want in empty.message, (case, empty.status, empty.message)
        masked = records[(names[ZERO_MASK], case)]
        assert masked.status is Status.MISMATCH and "non-finite" in masked.message, (case, masked.message)
