"""The training uses (harness.scenarios.uses) on real ranks: judged right, and their defects caught.

- double backward: a SyncBN differentiated by autograd through its collectives passes the oracle's second
  derivative; one whose backward is silently not differentiable is a mismatch on the parameter gradients;
- validation on a subset of ranks: a layer that synchronizes in eval is stopped at once, named;
- join: the documented hang ends within the case's time limit, attributed to SyncBN's all_gather;
- the table of Use classes covers exactly the catalog's names, and the search's systems name them all.
"""

from __future__ import annotations

import time

import pytest

from harness import catalog
from harness.catalog.case import CHECKPOINT_USES, USES
from harness.engine.session import RunOptions, resolve_impls, run_selection
from harness.judge.status import Status
from harness.scenarios import uses
from harness.search.systems import SYSTEMS, USE_OF

pytestmark = pytest.mark.usefixtures("support_on_path")


def run(impls, pattern, timeout=60):
    cases = catalog.select([pattern])
    return list(run_selection(cases, resolve_impls(impls), RunOptions(timeout=timeout, diagnose=False)))


def test_a_gradient_penalty_is_judged_by_the_oracles_second_derivative():
    good, silent = run(["textbook:TextbookSyncBN", "training_defects:SilentOnceDifferentiable"],
                       "double-backward/cnn/local/float64/uneven-3-5/ws2")
    assert good.status == Status.PASS, good.message
    assert "step0.train.penalized_grad_input" in {k.split(".", 1)[1] for k in good.metrics}
    assert silent.status == Status.MISMATCH
    assert any(".grad.bn1." in name and not m.ok for name, m in silent.metrics.items()), silent.message


def test_a_collective_in_validation_on_a_subset_is_stopped_and_named():
    (record,) = run(["training_defects:SyncsInEval"], "validation/eval-subset/cnn/local/ws3-2-4-3/ws3")
    assert record.status == Status.ERROR
    assert "barrier" in record.message and "evaluation" in record.message, record.message


def test_join_hangs_within_its_time_limit_and_names_the_collective():
    t0 = time.monotonic()
    (record,) = run(["reference"], "join/cnn/ws2", timeout=120)
    assert time.monotonic() - t0 < 60
    assert record.status == Status.HANG and record.known
    stacks = {o.rank: o.stack_dump or "" for o in record.ranks}
    assert "all_gather" in stacks[0] and "join" in stacks[1]


def test_every_use_name_has_its_use_and_every_use_a_name():
    assert sorted(uses.BY_NAME) == sorted(USES)
    assert all(type(u) is not uses.Use for u in uses.BY_NAME.values())  # each name changes something
    assert len({id(u) for u in uses.BY_NAME.values()}) == len(USES)
    for name in CHECKPOINT_USES:
        use = uses.BY_NAME[name]
        assert isinstance(use, uses.Checkpoint)
        assert name == f"checkpoint-{use.where}" + ("-reentrant" if use.reentrant else "")
        assert (use.layer_call() is not None) == (use.where == "layer")
    assert uses.of(catalog.select(["script/cnn/local/ws2"])[0]) is uses.BY_NAME["script"]
    assert uses.of(catalog.select(["ddp/cnn-sgd/broadcast-buffers-True-default-plain/float32/ws2"])[0]) is uses.PLAIN


def test_the_search_draws_every_use_and_no_other():
    drawn = [u for names in USE_OF.values() for u in names]
    assert sorted(drawn) == sorted(USES)
    assert set(USE_OF) <= set(SYSTEMS)

