"""What a rank sends for the checks across ranks (harness.scenarios.across), and the model scenario's DDP flags.

- ``Across`` crosses a pipe (as is) and JSON (steps as strings) and comes back the same, inside a RankResult;
- the one bitwise check names the step, its phase and the tensor that differ, leaves out a rank that sent
  nothing for a step, and compares only ranks of one group;
- ``case.ddp`` is parsed once into DdpOptions: arguments, accumulation, rank 0's checkpoint, unknown flags.
"""

from __future__ import annotations

import json
import pickle

import torch

from harness.catalog.case import Case
from harness.engine.messages import RankResult
from harness.judge.invariants import bits
from harness.judge.status import RankStatus
from harness.scenarios.across import Across, judge_bitwise
from harness.scenarios.model import DdpOptions, unsupported_reason


def _case(ws: int = 2, groups=None) -> Case:
    return Case(id=f"across/test/ws{ws}", family="across", batch_sizes=(2,) * ws, spatial=((3,),) * ws, channels=3,
                steps=("train", "eval"), groups=groups)


def test_across_comes_back_the_same_over_a_pipe_and_over_json():
    across = Across(bitwise={0: {"bn1.running_mean": bits(torch.tensor([1.0, 2.0]))}, 1: {"x": None}},
                    shares={"0": {"grad_weight": [1.0], "grad_bias": [2.0]}})
    result = RankResult(rank=1, status=RankStatus.PASS, across=across)
    assert RankResult.from_dict(pickle.loads(pickle.dumps(result.to_dict()))).across == across
    back = RankResult.from_dict(json.loads(json.dumps(result.to_dict()))).across
    assert back == across and sorted(back.bitwise) == [0, 1]
    assert RankResult.from_dict({"rank": 0}).across == Across()


def test_one_differing_tensor_is_named_by_step_phase_and_rank_and_a_silent_rank_is_left_out():
    same = bits(torch.tensor([1.0, 2.0]))
    other = bits(torch.nextafter(torch.tensor([1.0, 2.0]), torch.tensor(3.0)))
    per_rank = {0: Across(bitwise={0: {"a": same, "b": same}, 1: {"a": same}}),
                1: Across(bitwise={0: {"a": same, "b": same}, 1: {"a": other}}),
                2: Across(bitwise={0: {"a": same, "b": same}})}  # rank 2 sent nothing for step 1
    out = judge_bitwise(_case(3), per_rank)
    assert [name for name, _ in out] == ["step1.eval.a.across_ranks"], out
    assert "rank 0 vs rank 1" in out[0][1].describe() and "2 elements differ, by up to 1 ULPs" in out[0][1].describe()
    assert judge_bitwise(_case(3), per_rank, names=("b",)) == []
    # Ranks in different groups may differ.
    assert judge_bitwise(_case(3, groups=((0, 2), (1,))), per_rank) == []


def test_the_ddp_flags_are_parsed_once_into_options():
    ddp = DdpOptions.parse(("ddp", "broadcast_buffers=False", "bucket_cap_mb=0.0001", "static_graph", "no_sync=2",
                            "checkpoint-rank0"))
    assert ddp.on and ddp.accumulation == 2 and ddp.rank0_checkpoint and not ddp.unknown
    assert ddp.kwargs("g") == {"process_group": "g", "broadcast_buffers": False, "bucket_cap_mb": 0.0001,
                               "static_graph": True}
    assert DdpOptions.parse(()) == DdpOptions()
    assert DdpOptions.parse(("ddp",)).kwargs(None) == {"process_group": None}
    odd = Case(id="model/odd/ws2", family="model", batch_sizes=(2, 2), spatial=((4, 4),) * 2, channels=3,
               scenario="model", model="cnn", ddp=("ddp", "no_sync=x", "sync_often"))
    assert unsupported_reason(odd, None, "cpu", "gloo") == "unknown DDP flags ['no_sync=x', 'sync_often']"
