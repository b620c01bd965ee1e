"""The catalog's shape: families, stable IDs, the covering subset, known issues."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import catalog, known_issues
from harness.case import Case, materialize
from harness.covering import covers_all_pairs, pairwise
from harness.records import Record, Status

FAMILIES = {"allgather-shape", "mixed-precision", "channels-last", "module-config", "process-group", "numerics"}


def test_every_named_family_exists_with_a_docstring_naming_defects():
    fams = catalog.families()
    assert set(fams) == FAMILIES
    for name, mod in fams.items():
        assert mod.__doc__ and "Catches" in mod.__doc__, name
        assert any(c.isdigit() for c in mod.__doc__), f"{name}: no upstream issue number in its docstring"


def test_ids_are_unique_stable_and_prefixed():
    cases = catalog.all_cases()
    assert len({c.id for c in cases}) == len(cases)
    for c in cases:
        assert c.id.split("/")[0] == c.family
        assert c.id.endswith(f"/ws{c.world_size}")
    # The seed comes from the ID: the data of a case never changes with catalog order.
    c = catalog.select(["numerics/offset-1e3/ws2"])[0]
    assert c.seed == Case.from_dict(c.to_dict()).seed
    a, b = materialize(c), materialize(Case.from_dict(c.to_dict()))
    assert all(bool((x == y).all()) for x, y in zip(a.inputs[0], b.inputs[0]))


def test_matrix_crosses_dtypes_layouts_formats_and_world_sizes():
    full = [c for c in catalog.select(exhaustive=True) if c.family == "allgather-shape" and c.id.count("/") == 4]
    default = [c for c in full if c.default]
    assert len(full) == 8 * 6 * 3
    assert {c.world_size for c in default} == {2, 3, 4}
    factors = [sorted({c.id.split("/")[1] for c in full}), sorted({c.id.split("/")[2] for c in full}),
               sorted({c.memory_format for c in full})]
    rows = [(c.id.split("/")[1], c.id.split("/")[2], c.memory_format) for c in default]
    assert covers_all_pairs(rows, factors)
    assert len(default) < len(full) / 2
    # Every batch layout meets an empty rank and one sample per rank somewhere, and half types are there.
    assert any(0 in c.batch_sizes for c in default) and any(set(c.batch_sizes) == {1} for c in default)
    assert {"float16", "bfloat16", "float32", "float64"} <= {c.dtype for c in default}


def test_affine_parameters_are_not_ones_and_zeros():
    data = materialize(catalog.select(["module-config/input-3d/ws2"])[0])
    assert (data.weight < 0).any() and (data.weight > 0).any()
    assert not bool((data.weight == 1).all()) and not bool((data.bias == 0).all())


@pytest.mark.parametrize("sizes", [(2, 2), (3, 4, 2), (7, 6, 3), (2, 3, 4, 5)])
def test_pairwise_covers_every_pair(sizes):
    factors = [list(range(n)) for n in sizes]
    rows = pairwise(factors)
    assert covers_all_pairs(rows, factors)
    assert len(rows) <= len(list(itertools.product(*factors)))
    assert rows == pairwise(factors)  # deterministic


def _record(impl, case, status, torch_version="2.13.0+cpu"):
    return Record(case=case, family=case.split("/")[0], params={}, impl=impl, status=Status(status),
                  torch_version=torch_version)


def test_known_issue_matches_impl_case_version_and_status(tmp_path):
    f = tmp_path / "k.toml"
    f.write_text('[[issue]]\nimpl = "torch"\ncases = ["mixed-precision/empty-rank/*"]\ntorch = ">=1.12,<3"\n'
                 'status = "crash"\nlink = "https://example.invalid/1"\n')
    r = known_issues.annotate(_record("torch", "mixed-precision/empty-rank/x/ws2", "crash"), str(f))
    assert r.known_issue["matched"] and not r.failed
    r = known_issues.annotate(_record("torch", "mixed-precision/empty-rank/x/ws2", "mismatch"), str(f))
    assert not r.known_issue["matched"] and r.failed  # another failure is a real one
    r = known_issues.annotate(_record("torch", "mixed-precision/empty-rank/x/ws2", "pass"), str(f))
    assert r.known_issue["now_passes"]
    r = known_issues.annotate(_record("torch", "mixed-precision/empty-rank/x/ws2", "crash", "1.11.0"), str(f))
    assert r.known_issue is None and r.failed
    r = known_issues.annotate(_record("reference", "mixed-precision/empty-rank/x/ws2", "crash"), str(f))
    assert r.known_issue is None


def test_bad_known_issues_file_names_the_problem(tmp_path):
    from harness.errors import UsageError

    f = tmp_path / "k.toml"
    f.write_text('[[issue]]\nimpl = "torch"\ncases = ["*"]\ntorch = "newest"\nstatus = "crash"\nlink = "x"\n')
    with pytest.raises(UsageError, match="'newest' is not a version specifier"):
        known_issues.load(str(f))


def test_shipped_known_issues_file_is_valid():
    entries = known_issues.load()
    assert entries and all(e["link"].startswith("https://") for e in entries)


@pytest.mark.slow
def test_pytest_collects_and_runs_cases_with_xdist_and_junit(tmp_path):
    """`pytest cases/ -n 2 --junitxml` with real pools per worker; a known issue is an xfail."""
    root = Path(__file__).resolve().parent.parent
    junit = tmp_path / "cases.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(root / "cases"), "-n", "2", "-p", "no:cacheprovider", "-q",
         "--impl", "reference", "--impl", "torch", "--case", "mixed-precision/empty-rank/float16-float32/ws2",
         "--case", "channels-last/uneven/*", f"--junitxml={junit}"],
        capture_output=True, text=True, timeout=600, cwd=root, env=dict(os.environ))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "5 passed, 1 xfailed" in proc.stdout
    xml = junit.read_text()
    assert 'name="test_case[channels-last/uneven/channels_last_3d/ws2-reference]"' in xml


@pytest.mark.slow
def test_compare_two_implementations_on_the_same_inputs():
    from harness import runner

    opts = runner.RunOptions(compare=("torch", "reference"))
    records = list(runner.run_selection(catalog.select(["numerics/offset-1e3/ws2"]),
                                        runner.resolve_impls(["torch", "reference"]), opts))
    torch_rec = next(r for r in records if r.impl == "torch")
    assert torch_rec.compare["with"] == "reference" and torch_rec.compare["error"] is None
    diffs = torch_rec.compare["max_abs_diff"]
    assert {"step0.train.output", "step0.train.grad_input", "step0.train.running_var"} <= set(diffs)
    assert all(0 <= v < 1e-2 for v in diffs.values())
    json.dumps(torch_rec.to_dict())  # JSON-safe
