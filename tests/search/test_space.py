"""The search's case space, signatures and promotion, without processes.

- every drawn case is a valid Case within the space's bounds, its ID stable and naming what known issues
  match on (dtypes, split, settings), its steps well defined for every group;
- a signature names the failure without steps or ranks, so a shrunk case can keep it;
- promotion writes a catalog file that the catalog selects, once per ID.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings

from harness.catalog.case import STEP_KINDS, Case
from harness.judge.metric import Metric, Problem
from harness.results.records import RankOutcome, RankStatus, Record, Status
from harness.search import promote, space
from harness.search.signature import signature, tensor_kind


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(space.strategy())
def test_every_drawn_case_is_valid_bounded_and_named_for_what_it_is(case: Case):
    assert case.family == "search" and case.id.startswith("search/")
    assert case.world_size in space.WORLD_SIZES
    assert not case.default
    sizes = [case.sizes_at(s) for s in range(len(case.steps))]
    per_rank = max(b * math.prod(sp) for row in sizes for b, sp in zip(row, case.spatial))
    assert per_rank * case.channels <= space.MAX_ELEMENTS
    groups = case.groups or (tuple(range(case.world_size)),)
    for kind, row in zip(case.steps, sizes):
        if STEP_KINDS[kind] == "train":
            for g in groups:
                assert sum(row[r] * math.prod(case.spatial[r]) for r in g) >= 2
    assert f"/{case.dtype}-{case.param_dtype}/" in case.id
    assert f"/{space.split_label(case.batch_sizes)}/" in case.id
    assert ("momentum-none" in case.id) == (case.momentum is None)
    assert ("no-running-stats" in case.id) == (not case.track_running_stats)
    # The same parameters give the same ID; any other parameter another.
    again = space.make_case(**{k: v for k, v in case.to_dict().items() if k not in ("id", "family", "default", "note")
                               and k not in ("scenario", "model", "optimizer", "ddp", "checkpoint", "compile")})
    assert again.id == case.id
    assert Case.from_dict(case.to_dict()) == case


def test_ids_differ_when_any_parameter_does():
    base = dict(batch_sizes=(2, 3), spatial=((4,), (4,)), channels=3, seed=5)
    a = space.make_case(**base)
    assert space.make_case(**base).id == a.id
    assert space.make_case(**{**base, "seed": 6}).id != a.id
    assert space.make_case(**{**base, "eps": 1e-3}).id != a.id
    assert a.id == "search/float32-float32/contiguous/uneven-2-3/c3x4/plain/train/ws2-" + a.id.rsplit("-", 1)[1]


def _record(status, metrics=None, ranks=None, desync=None, impl="x"):
    return Record(case="search/c", family="search", params={}, impl=impl, status=status,
                  metrics={k: (Metric(1.0, 1.0, 0.1, v) if isinstance(v, float) else v)
                           for k, v in (metrics or {}).items()},
                  ranks=ranks or [], desync=desync)


def test_signature_names_the_first_failing_tensor_without_step_or_rank():
    rec = _record(Status.MISMATCH, {"rank0.step0.train.output": 0.5, "rank0.step2.train.running_var": 9.0,
                                    "rank1.step1.eval.output": 3.0})
    assert signature(rec) == "x: mismatch (eval.output)"
    assert tensor_kind("step3.train.running_mean.across_ranks") == "train.running_mean.across_ranks"
    assert tensor_kind("rank1.convert.2") == "convert"
    # The kind is the judgement's (harness.judge.elementwise sets it), never read back from the message.
    wrong_dtype = _record(Status.MISMATCH, {"rank0.step0.train.output": Metric.failure(
        "dtype torch.float32, expected torch.float16", Problem.DTYPE)})
    nan = _record(Status.MISMATCH, {"rank0.step0.train.output": Metric(
        math.inf, math.inf, 0.0, math.inf, "2 non-finite values where the oracle is finite", Problem.NON_FINITE)})
    unkinded = _record(Status.MISMATCH, {"rank0.step0.train.output": Metric.failure("mentions a dtype, is none")})
    assert signature(wrong_dtype) == "x: mismatch (train.output: dtype)"
    assert signature(nan) == "x: mismatch (train.output: non-finite)"
    assert signature(unkinded) == "x: mismatch (train.output)"
    assert signature(_record(Status.PASS)) is None
    assert signature(_record(Status.UNSUPPORTED)) is None


def test_signature_of_errors_crashes_hangs_and_desyncs():
    err = _record(Status.ERROR, ranks=[RankOutcome(0, RankStatus.PEER_FAILED),
                                       RankOutcome(1, RankStatus.ERROR, exception_type="ValueError")])
    assert signature(err) == "x: error (ValueError)"
    crash = _record(Status.CRASH, ranks=[RankOutcome(1, RankStatus.CRASH, signal="SIGABRT")],
                    desync={"calls": {"0": {"op": "all_gather"}, "1": {"op": "all_gather"}}})
    assert signature(crash) == "x: crash (desync all_gather, SIGABRT)"
    assert signature(_record(Status.HANG)) == "x: hang (timeout)"


def test_budget_durations_parse_and_bad_ones_name_the_fix():
    from harness.commands.search import parse_duration
    from harness.errors import UsageError

    assert parse_duration("300") == 300 and parse_duration("90s") == 90
    assert parse_duration("10m") == 600 and parse_duration("1.5h") == 5400
    for bad in ("", "ten", "5d", "0", "-3m"):
        with pytest.raises(UsageError, match="10m"):
            parse_duration(bad)


def test_promotion_writes_a_catalog_file_once_per_case(tmp_path):
    case = space.make_case(batch_sizes=(0, 4), spatial=((3,), (3,)), channels=2, dtype="float16")
    rec = _record(Status.MISMATCH, {"rank0.step0.train.output": 5.0})
    finding = SimpleNamespace(minimal=case, signature="x: mismatch (train.output)", impl="x", record=rec)
    build = SimpleNamespace(torch_version="2.13.0", torch_git_version="abc")
    path = tmp_path / "search_found.json"
    _, added = promote.promote([finding, finding], build=build, path=path)
    assert added == [case.id]
    _, again = promote.promote([finding], build=build, path=path)
    assert again == []
    (got,) = promote.promoted_cases(path)
    assert got.id == case.id and got.default and got.batch_sizes == (0, 4)
    entry = json.loads(path.read_text())[0]
    assert entry["finding"]["signature"] == "x: mismatch (train.output)"
    assert not list(tmp_path.glob(".search_found-*"))  # the file was replaced, nothing left beside it


def test_a_broken_catalog_file_is_a_usage_error_naming_it(tmp_path):
    from harness.errors import UsageError

    path = tmp_path / "search_found.json"
    path.write_text('{"not": "a list"}')
    with pytest.raises(UsageError, match="search_found.json"):
        promote.load(path)


def test_promote_command_takes_a_summary_and_refuses_a_bad_number(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from harness.commands import cli, load_commands

    load_commands()
    case = space.make_case(batch_sizes=(3, 0), spatial=((2, 2), (2, 2)), channels=3, momentum=None)
    summary = tmp_path / "findings.json"
    summary.write_text(json.dumps({"findings": [
        {"signature": "k: crash (SIGABRT)", "impl": "k", "known": True, "status": "crash", "minimal_case": "x",
         "minimal_params": {}, "minimal": case.to_dict()},
        {"signature": "p: mismatch (train.output)", "impl": "p", "known": False, "status": "mismatch",
         "minimal_case": case.id, "minimal_params": case.params(), "minimal": case.to_dict(), "message": "m"}]}))
    found = tmp_path / "found.json"
    monkeypatch.setenv("SYNCBN_HARNESS_FOUND", str(found))
    runner = CliRunner()
    result = runner.invoke(cli, ["promote", str(summary)])
    assert result.exit_code == 0, result.output
    assert f"promoted {case.id}" in result.output
    assert [e["case"]["id"] for e in json.loads(found.read_text())] == [case.id]  # the known one is not promoted
    result = runner.invoke(cli, ["promote", str(summary), "--finding", "3"])
    assert result.exit_code != 0 and "findings 1 to 2" in str(result.exception or result.output)
