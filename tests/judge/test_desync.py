"""What the ranks said to each other: every rank's collectives in its record, and the checks on them.

The planted collective defects (tests/support/defects.py: a collective in
eval, a rank that skips the collectives, a dtype that differs on one rank, a
process group ignored in one of two collectives) run through the real engine
and must each be caught with a message that names the collective. The rules
of :mod:`harness.judge.desync` are also checked on plain data.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness import catalog
from harness.engine.session import RunOptions, resolve_impls, run_selection
from harness.judge.desync import first_divergence
from harness.judge.status import Status

SUPPORT = str(Path(__file__).resolve().parents[1] / "support")
pytestmark = pytest.mark.usefixtures("support_on_path")



def _collective_defects():
    sys.path.insert(0, SUPPORT)
    import defects

    return defects.COLLECTIVE_DEFECTS


def call(op, dtype, n, group=(0, 1), step=0):
    return {"op": op, "group": list(group), "dtype": dtype, "shape": [n], "numel": n, "step": step}


@pytest.mark.slow
@pytest.mark.parametrize("defect", sorted(_collective_defects(), key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_a_collective_defect_is_caught_and_the_message_names_the_collective(defect):
    case_id, status, names = _collective_defects()[defect]
    statuses = {Status(s) for s in ((status,) if isinstance(status, str) else status)}
    [record] = run_selection(catalog.select([case_id]), resolve_impls([f"defects:{defect.__name__}"]),
                             RunOptions(timeout=10, diagnose=False))
    assert record.status in statuses, (record.status, record.message)
    assert names in record.message, record.message
    assert all(r.collectives is not None for r in record.ranks), "every rank's collectives are in the record"


@pytest.mark.slow
def test_every_rank_of_a_passing_case_carries_its_collectives():
    [record] = run_selection(catalog.select(["allgather-shape/uneven-2-6/float32-float32/contiguous/ws2"]),
                             resolve_impls(["reference"]), RunOptions(timeout=60))
    assert record.status == Status.PASS and record.desync is None
    ops = [[(c["op"], c["group"], c["step"]) for c in r.collectives] for r in record.ranks]
    assert ops[0] == ops[1] and ops[0], ops
    assert {c["step"] for r in record.ranks for c in r.collectives} == {0}
    assert all(c["dtype"] and c["numel"] > 0 for r in record.ranks for c in r.collectives)


def test_the_first_divergence_names_both_sides():
    calls = {0: [call("all_gather", "float32", 7), call("all_reduce", "float16", 7, step=1)],
             1: [call("all_gather", "float32", 7), call("all_reduce", "float32", 7, step=1)]}
    d = first_divergence(calls, finished=[])
    assert d.index == 1 and d.group == [0, 1]
    assert d.message == "rank 0 all_reduce float16[7] vs rank 1 float32[7] (collective 1 over ranks [0, 1], step 1)"


def test_a_rank_that_stopped_explains_its_own_silence_but_one_that_finished_skipped():
    calls = {0: [call("all_gather", "float32", 7), call("all_reduce", "float32", 6)],
             1: [call("all_gather", "float32", 7)]}
    assert first_divergence(calls, finished=[]) is None  # rank 1 crashed or raised: that is its story
    d = first_divergence(calls, finished=[1])
    assert d.message.startswith("rank 0 all_reduce float32[6] vs rank 1 nothing: it finished the case without")


def test_groups_are_compared_apart_and_unknown_ranks_are_left_out():
    calls = {0: [call("all_reduce", "float32", 3, group=(0, 2))], 2: [call("all_reduce", "float32", 3, group=(0, 2))],
             1: [call("all_reduce", "float32", 3, group=(1, 3))], 3: [call("all_reduce", "float64", 3, group=(1, 3))],
             4: None}
    d = first_divergence(calls, finished=[0, 1, 2, 3])
    assert d.group == [1, 3] and "rank 1 all_reduce float32[3] vs rank 3 float64[3]" in d.message
    same_bytes_other_shape = {0: [dict(call("all_gather", "float32", 6), shape=[2, 3])],
                              1: [call("all_gather", "float32", 6)]}
    assert first_divergence(same_bytes_other_shape, finished=[0, 1]) is None


@pytest.mark.slow
def test_an_unexpected_crash_is_run_again_with_collective_debugging_and_keeps_its_status():
    case = "allgather-shape/empty-0-5/float32-float32/contiguous/ws2"
    [record] = run_selection(catalog.select([case]), resolve_impls(["defects:EmptyRankSendsInputDtype"]),
                             RunOptions(timeout=20))
    assert record.status == Status.CRASH, record.message  # the first run's, whatever the second says
    d = record.diagnosis
    assert d["env"] == {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"} and d["status"] in ("crash", "error", "hang")
    assert d["summary"] and "mismatch" in d["summary"].lower(), d
    assert any("Float" in line and "Double" in line for r in d["ranks"] for line in r["evidence"]), d
