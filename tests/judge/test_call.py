"""A recorded collective call: its stored form round-trips unchanged, and "the same call" is op, dtype, numel."""

from __future__ import annotations

import json

from harness.judge.call import Call, read_calls

GATHER = {"op": "all_gather", "group": [0, 1], "step": 2, "dtype": "float16", "shape": [2, 11], "numel": 22}
BARRIER = {"op": "barrier", "group": [0, 1, 2], "step": None}


def test_the_stored_form_round_trips_to_the_same_json():
    for stored in (GATHER, BARRIER, {"op": "all_reduce", "group": [], "step": 0, "dtype": "float32", "shape": [],
                                     "numel": 1}):
        call = Call.from_dict(stored)
        assert json.dumps(call.to_dict()) == json.dumps(stored)
    assert Call.from_dict(GATHER) == Call("all_gather", (0, 1), "float16", (2, 11), 22, 2)


def test_the_same_call_on_two_ranks_is_op_dtype_and_numel():
    mine = Call.from_dict(GATHER)
    assert mine.signature() == ("all_gather", "float16", 22)
    assert Call.from_dict({**GATHER, "shape": [1, 22], "step": 5}).signature() == mine.signature()
    assert Call.from_dict({**GATHER, "dtype": "float32"}).signature() != mine.signature()
    assert Call.from_dict({**GATHER, "numel": 23}).signature() != mine.signature()


def test_a_call_describes_its_tensor_and_a_call_without_one_is_its_op():
    assert Call.from_dict(GATHER).describe() == "all_gather float16[2,11]"
    assert Call.from_dict(GATHER).describe(op=False) == "float16[2,11]"
    assert Call.from_dict(BARRIER).describe() == Call.from_dict(BARRIER).describe(op=False) == "barrier"
    assert Call.from_dict({"op": "barrier"}).group == ()  # a call whose group was not recorded


def test_unknown_calls_stay_unknown():
    assert read_calls(None) is None and read_calls([]) == []
    assert read_calls([GATHER, BARRIER]) == [Call.from_dict(GATHER), Call.from_dict(BARRIER)]
