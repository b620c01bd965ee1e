"""Promotion of search findings, without processes: it writes a catalog file that the catalog selects, once per
ID; a broken file is a usage error naming it; the ``promote`` command takes a search summary."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from harness.judge.metric import Metric
from harness.judge.status import Status
from harness.results.records import Record
from harness.search import promote, space


def _record(status, metrics):
    return Record(case="search/c", family="search", params={}, impl="x", status=status,
                  metrics={k: Metric(1.0, 1.0, 0.1, v) for k, v in metrics.items()})


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
