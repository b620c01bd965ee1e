"""The command line: flags, usage errors with the valid choices, and a real run end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from harness.cli import _load_commands, cli, main

_load_commands()

SPEC_RECORD_KEYS = {"schema_version", "case", "family", "params", "impl", "impl_version", "mode", "status",
                    "message", "ranks", "metrics", "torch_version", "torch_git_version", "cuda_version", "device",
                    "backend", "world_size", "duration_s", "started_at", "host"}
SPEC_PARAM_KEYS = {"dtype", "param_dtype", "memory_format", "ndim", "batch_sizes", "world_size", "affine",
                   "track_running_stats", "momentum", "steps"}


def _main(args, capsys):
    with pytest.raises(SystemExit) as info:
        main(args)
    out = capsys.readouterr()
    return info.value.code, out.out, out.err


def test_unknown_impl_lists_the_valid_ones(capsys):
    code, _, err = _main(["run", "--impl", "apx", "--case", "allgather-shape/*"], capsys)
    assert code == 2
    assert "unknown impl 'apx'" in err and "reference" in err and "MODULE:ATTR" in err


def test_unknown_case_pattern_lists_the_families(capsys):
    code, _, err = _main(["run", "--impl", "reference", "--case", "nosuch/*"], capsys)
    assert code == 2
    assert "nosuch/*" in err and "allgather-shape" in err and "list cases" in err


def test_bad_option_value_is_a_usage_error(capsys):
    code, _, err = _main(["run", "--device", "tpu"], capsys)
    assert code == 2 and "tpu" in err


def test_list_cases_json_has_ids_families_and_params():
    result = CliRunner().invoke(cli, ["list", "cases", "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert len(rows) >= 30
    families = {r["family"] for r in rows}
    assert {"allgather-shape", "mixed-precision", "channels-last", "module-config", "process-group",
            "numerics"} <= families
    for r in rows:
        assert r["id"].startswith(r["family"] + "/")
        assert SPEC_PARAM_KEYS <= set(r["params"])
    assert len({r["id"] for r in rows}) == len(rows)


def test_env_reports_the_build():
    import torch

    result = CliRunner().invoke(cli, ["env", "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["torch"] == torch.__version__
    assert data["torch_git_version"] == torch.version.git_version
    assert "gloo" in data["backends"]
    assert data["apex"].startswith(("not installed", "installed", "apex.parallel"))
    assert data["kernels"].startswith(("built", "not built"))


@pytest.mark.slow
def test_run_reference_json_all_pass():
    """The issue's acceptance: `run --impl reference --device cpu --format json` prints passing records."""
    proc = subprocess.run([sys.executable, "-m", "harness", "run", "--impl", "reference", "--device", "cpu",
                           "--format", "json"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = json.loads(proc.stdout)
    assert len(records) >= 30
    assert {r["status"] for r in records} == {"pass"}
    for r in records:
        assert SPEC_RECORD_KEYS <= set(r), SPEC_RECORD_KEYS - set(r)
        assert SPEC_PARAM_KEYS <= set(r["params"])
        assert len(r["ranks"]) == r["world_size"]
        assert r["metrics"], r["case"]
        assert all(m["ok"] for m in r["metrics"].values())
    assert {r["world_size"] for r in records} == {2, 3, 4}
