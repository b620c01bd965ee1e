"""The proof that the catalog and the tolerances work, with real processes and real gloo.

- Three correct SyncBNs written independently of the reference and of each
  other (textbook.py: autograd through differentiable all_reduces; gather.py:
  an all_gather of float64 moments with a hand-written backward;
  float32_syncbn.py: float32 arithmetic throughout, as the CUDA kernels of
  torch and apex) raise no alarm on the default selection (known issues of
  torch's DDP aside: they are DDP's, met by every implementation), and the
  float32 one and the reference none on the full product either (a fixed
  third of it beyond the default selection unless
  ``SYNCBN_HARNESS_FULL_PRODUCT=1``: :func:`sampled`).
- Every planted defect (defects.py: the kinds real implementations shipped)
  is caught by default-selection cases of the families meant to catch it,
  as a mismatch on the tensor it corrupts.
"""

from __future__ import annotations

import fnmatch
import os
import sys
import zlib
from collections import Counter
from pathlib import Path

import pytest
from correct_budget import CORRECT_USE_AT_MOST

from harness import catalog
from harness.engine.session import RunOptions, resolve_impls, run_selection
from harness.judge.status import Status
from harness.selection import DEFAULT_TIMEOUT_S

SUPPORT = str(Path(__file__).resolve().parents[1] / "support")
pytestmark = pytest.mark.usefixtures("support_on_path")



def run(impl_names, cases, timeout=DEFAULT_TIMEOUT_S):
    # The sweeps run under a run's default timeout: a compile case's first run includes inductor's compile, which
    # took over 60 s on a slow two-core machine with the other xdist worker busy (a "hang" of a correct SyncBN).
    return list(run_selection(cases, resolve_impls(impl_names), RunOptions(timeout=timeout, diagnose=False)))


def assert_quiet(records, n):
    assert len(records) == n
    # unsupported: what an implementation declares it cannot do (double backward, TorchScript), never run.
    bad = [f"{r.impl} {r.case}: {r.status.value} {r.message}" for r in records
           if r.status not in (Status.PASS, Status.UNSUPPORTED) and not r.known]
    assert not bad, "\n".join(bad)
    worst = max(r.worst_ratio for r in records if not r.known and r.status == Status.PASS)
    assert 0 < worst < CORRECT_USE_AT_MOST, worst


# The conversion models that ask of a converter more than arithmetic (a subclass kept, a lazy layer, a module
# registered twice, a qconfig): tests/scenarios/test_conversion.py runs them with the reference and planted
# converters. The independent implementations here bring textbook converters, so they run the other models.
CONVERTER_MODELS = ("bn-act", "lazy", "nested")


def judged(cases):
    # Textbook converters meet the conversion models' traps by design; a correct SyncBN need not compile
    # under fullgraph=True (it is allowed graph breaks): neither is a numerical alarm.
    return [c for c in cases if not (c.family == "conversion" and c.model in CONVERTER_MODELS)
            and "fullgraph" not in c.compile]


def full_product():
    """Every family's full product but DDP's and FSDP2's (their products vary the wrapper's flags, not SyncBN's
    arithmetic, and cost a second or two a case: their default selections are covered below), the cuda-graph
    family's (it needs a GPU) and the scale family's (180 cases of 3 to 25 million values per rank cost hours
    on two cores: its default rows are covered below, and tests/judge/test_scale_tolerance.py checks the
    budgets at its largest size)."""
    return judged([c for c in catalog.select(exhaustive=True)
                   if c.family not in WRAPPED + ("scale",) and c.scenario != "cuda_graph"])


WRAPPED = ("ddp", "fsdp")  # the families that vary a data-parallel wrapper's options


# CI runs a third of the full product's cases beyond the default selection (the same third every time, every
# family in it); the whole of it: SYNCBN_HARNESS_FULL_PRODUCT=1 pytest -m sweep tests/judge/test_judgement.py.
FULL = os.environ.get("SYNCBN_HARNESS_FULL_PRODUCT") == "1"
SHARE = 3


def sampled(cases, default_ids):
    """The default selection's cases and, unless FULL, one beyond it in SHARE (by a hash of the ID, so the same
    ones every run), and the first of each family whichever its hash."""
    if FULL:
        return cases
    first = {}
    for c in cases:
        first.setdefault(c.family, c.id)
    return [c for c in cases if c.id in default_ids or c.id == first[c.family]
            or zlib.crc32(c.id.encode()) % SHARE == 0]


@pytest.mark.sweep(172)
@pytest.mark.slow
def test_correct_implementations_raise_no_alarm_on_the_default_selection():
    """The textbook and gather SyncBNs on the whole default selection; the float32 one on the default cases
    the full product below leaves out (it runs the rest there: no pair is run twice)."""
    cases = judged(catalog.select())
    assert any(c.family == "conversion" for c in cases)
    product = {c.id for c in full_product()}
    rest = [c for c in cases if c.id not in product]
    assert rest and all(c.family in WRAPPED + ("scale",) for c in rest)
    records = (run(["textbook:TextbookSyncBN", "gather:GatherSyncBN"], cases)
               + run(["float32_syncbn:Float32SyncBN"], rest))
    assert_quiet(records, 2 * len(cases) + len(rest))


@pytest.mark.sweep(135)
@pytest.mark.slow
@pytest.mark.parametrize("impl", ["float32_syncbn:Float32SyncBN", "reference"])
def test_the_float32_implementation_and_the_reference_are_quiet_on_the_full_product(impl):
    """The reference's default-selection cases are left out: the CLI's run of the whole default selection
    (tests/commands/test_cli.py, test_run_reference_json_all_pass) holds them to the same bound."""
    product = full_product()
    default = {c.id for c in judged(catalog.select())}
    cases = sampled(product, default)
    assert len(cases) > len(default & {c.id for c in cases})  # more than the default selection's share
    assert {c.family for c in cases} == {c.family for c in product}
    if impl == "reference":
        selected = {c.id for c in catalog.select()}  # once: not again for every case of the product
        cases = [c for c in cases if c.id not in selected]
    assert_quiet(run([impl], cases), len(cases))


def _defects():
    sys.path.insert(0, SUPPORT)
    import defects

    return defects.CATCHERS


@pytest.mark.slow
@pytest.mark.parametrize("defect", sorted(_defects(), key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_planted_defect_is_caught_on_the_tensor_it_corrupts(defect):
    patterns, status, evidence = _defects()[defect]
    statuses = {Status(s) for s in ((status,) if isinstance(status, str) else status)}
    cases = [c for c in catalog.select() if any(fnmatch.fnmatchcase(c.id, p) for p in patterns)]
    assert cases, f"no default case matches {patterns}"
    records = run([f"defects:{defect.__name__}"], cases, timeout=20)

    def shows(r) -> bool:
        if evidence is None:
            return True
        if r.status == Status.MISMATCH:  # the judgement, on the tensor the defect corrupts
            return any(evidence in name and not m.ok for name, m in r.metrics.items())
        return evidence in r.message  # an error: the exception that names it

    caught = [r for r in records if r.status in statuses and shows(r)]
    assert caught, (f"{defect.__name__}: no {status} showing {evidence} in {patterns}: "
                    f"{Counter((r.status.value, r.message[:80]) for r in records).most_common(3)}")
    assert all(r.message for r in caught)
