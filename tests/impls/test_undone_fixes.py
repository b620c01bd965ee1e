"""cpu-emulation catches torch's SyncBatchNorm with an upstream fix undone, as CUDA would, and one not yet released.

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

The other way round: torch 2.13's kernels round the contiguous backward_reduce's partial sums to half input's dtype
(pytorch#195701, fixed by pytorch#196125 after 2.14): gradients scaled by 2**16 with a mean overflow them, while the
same module over the emulation of a release with the fix passes.
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


SCALED = "mixed-precision/scaled-grads/float16-float32/ws2"
SCALED_CL = "mixed-precision/scaled-grads-channels-last/float16-float32/ws2"


@pytest.mark.slow(8)
@pytest.mark.usefixtures("support_on_path")
def test_scaled_gradients_overflow_torchs_half_partials_until_pytorch_196125():
    """pytorch#195701: half input, gradients scaled as GradScaler scales them, with a mean. The emulated 2.13 kernel
    rounds its contiguous partial sums to half: inf, a known issue; its channels-last kernel does not; the same
    module and Function over the kernels of a release with pytorch#196125 pass (run in pools of their own, since
    the plugin changes the rank's emulation)."""
    cases = catalog.select([SCALED, SCALED_CL])
    by = {(r.impl, r.case): r for r in run_selection(cases, resolve_impls(["torch"]), RunOptions(timeout=120))}
    bad = by[("torch", SCALED)]
    assert bad.status is Status.MISMATCH and "non-finite values where the oracle is finite" in bad.message
    assert bad.known and bad.known_issue.link.endswith("/issues/195701")
    assert by[("torch", SCALED_CL)].status is Status.PASS, by[("torch", SCALED_CL)].message
    [fixed] = run_selection(catalog.select([SCALED]), resolve_impls(["undone_fixes:Float2Widened"]),
                            RunOptions(timeout=120))
    assert fixed.status is Status.PASS, fixed.message
