"""The conversion family: the reference's converter keeps every behaviour, planted converter defects are caught.

Checkpoint round trips (resume at another world size, revert to the plain model, load on rank 0 under DDP)
are part of the family and of the reference's run.

The planted converters (tests/support/converters.py) are the reference
SyncBN with a ``convert_sync_batchnorm`` written the way real converters went
wrong; each runs through the real engine on a default-selection case and must
fail with a message that says what the conversion changed. The oracle's
per-rank parameter-gradient shares are checked on their own: summed over the
ranks they are the whole loss's gradient.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from harness import catalog
from harness.engine.session import RunOptions, resolve_impls, run_selection
from harness.judge.status import Status
from harness.scenarios import user_models
from harness.scenarios.conversion import _global_truth, _snapshot, conversion_problems

SUPPORT = str(Path(__file__).resolve().parents[1] / "support")
pytestmark = pytest.mark.usefixtures("support_on_path")



def _catchers():
    sys.path.insert(0, SUPPORT)
    import converters

    return converters.CATCHERS


@pytest.mark.slow(25)
def test_the_reference_converter_passes_the_whole_family_checkpoints_and_reverts_included():
    cases = [c for c in catalog.select(["conversion/*"], exhaustive=True)]
    from harness.catalog.case import CONVERSION_MODELS, MORE_CONVERSION_MODELS
    from harness.scenarios.checkpoint import MODES

    # The first models x 3 layouts x 2 dtypes, the round trips, the later models (other-norms without the empty
    # layout), the revert cases (3 models x 2 layouts x 2 dtypes).
    assert len(cases) == (len(CONVERSION_MODELS) * 3 * 2 + len(MODES) * 2 * 2
                          + len(MORE_CONVERSION_MODELS) * 3 * 2 - 2 + 3 * 2 * 2)
    assert {c.scenario for c in cases} == {"conversion", "checkpoint", "revert"}
    records = list(run_selection(cases, resolve_impls(["reference"]), RunOptions(timeout=60, diagnose=False)))
    bad = [(r.case, r.message) for r in records if r.status is not Status.PASS]
    assert not bad, bad


@pytest.mark.slow
@pytest.mark.parametrize("defect", sorted(_catchers(), key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_a_planted_converter_defect_is_caught_and_said(defect):
    case_id, words = _catchers()[defect]
    assert case_id in {c.id for c in catalog.select()}, "the exposing case must be in the default selection"
    [record] = run_selection(catalog.select([case_id]), resolve_impls([f"converters:{defect.__name__}"]),
                             RunOptions(timeout=60, diagnose=False))
    assert record.status is Status.MISMATCH, (record.status, record.message)
    assert words in record.message, record.message


def test_the_shares_of_the_oracle_add_up_to_the_whole_gradient():
    model = user_models.build("nested", 4, seed=3, dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(n, 4, 3, 2, generator=gen, dtype=torch.float64) for n in (2, 0, 3)]
    gs = [torch.randn_like(x) for x in xs]
    whole = user_models.build("nested", 4, seed=3, dtype=torch.float64)
    whole.train()
    y = whole(torch.cat(xs))
    (y * torch.cat(gs)).sum().backward()
    _, _, shares = _global_truth(model, xs, gs, train=True)
    for name, p in whole.named_parameters():
        total = sum(s[name] for s in shares)
        assert torch.allclose(total, p.grad, rtol=1e-12, atol=1e-12), name
    assert all(float(v.abs().sum()) == 0 for v in shares[1].values()), "an empty rank contributes nothing"


def test_what_torchs_converter_changes_is_said_in_a_sentence():
    model = user_models.build("nested", 4, seed=1)
    before = _snapshot(model)
    problems = conversion_problems(before, torch.nn.SyncBatchNorm.convert_sync_batchnorm(model))
    assert problems == ["one module registered as shared and stages.1.norm became 2 modules"]
    model = user_models.build("bn-act", 4, seed=1)
    problems = conversion_problems(_snapshot(model), torch.nn.SyncBatchNorm.convert_sync_batchnorm(model))
    assert problems == ["1 was BatchNormAct2d, whose forward does more than normalize; it is now SyncBatchNorm, "
                        "and that behaviour is gone"]
    from harness.impls.reference import SyncBatchNorm

    for name in user_models.MODELS:
        model = user_models.build(name, 4, seed=1)
        assert conversion_problems(_snapshot(model), SyncBatchNorm.convert_sync_batchnorm(model)) == [], name
    for name in ("no-bias", "other-norms"):  # torch's converter carries bias=False and leaves the other norms
        model = user_models.build(name, 4, seed=1)
        assert conversion_problems(_snapshot(model), torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)) == []


def test_a_converter_that_touches_the_other_norms_or_grows_a_bias_is_said_to():
    """The sentences of conversion_problems for the two later models, on conversions made to go wrong."""
    from harness.impls.reference import SyncBatchNorm

    model = user_models.build("other-norms", 4, seed=1)
    before = _snapshot(model)
    assert set(before["others"]) == {"in2d", "in1d", "in3d", "gn", "ln"}
    converted = SyncBatchNorm.convert_sync_batchnorm(model)
    assert conversion_problems(before, converted) == []
    converted.gn = torch.nn.GroupNorm(2, 4)  # replaced by another module of the same class
    converted.in1d = SyncBatchNorm(4)  # what a converter matching every _NormBase makes of it
    problems = conversion_problems(before, converted)
    assert problems[:2] == ["in1d was InstanceNorm1d, which normalizes each sample alone; it is now SyncBatchNorm",
                            "gn (GroupNorm) was replaced by another module"], problems
    assert len(problems) == 6 and all("was copied, not shared" in p for p in problems[2:])
    model = user_models.build("no-bias", 4, seed=1)
    before = _snapshot(model)
    assert model[1].bias is None and model[1].weight is not None
    converted = SyncBatchNorm.convert_sync_batchnorm(model)
    assert conversion_problems(before, converted) == [] and converted[1].bias is None
    converted[1].bias = torch.nn.Parameter(torch.zeros(4))  # the bias a converter written before bias=False keeps
    assert conversion_problems(before, converted) == [
        "parameter 1.bias exists after conversion and was None before (bias=False not carried over)"]

def test_timm_is_opt_in_and_says_what_it_needs():
    from harness.errors import ImplUnavailable
    from harness.impls import builtin_names, default_names, resolve

    assert "timm" in builtin_names() and "timm" not in default_names()
    impl = resolve("timm")
    case = next(c for c in catalog.select() if c.family == "numerics")
    assert "converter only" in impl.unsupported_reason(case, "cpu")
    try:
        import timm.layers  # noqa: F401
    except Exception:
        with pytest.raises(ImplUnavailable, match="timm not importable"):
            impl.check_available_on("cpu")
    else:
        pytest.skip("timm imports here: its records run (see the README's conversion findings)")
