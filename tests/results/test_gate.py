"""`gate` (and `diff` on the command line): a build against a baseline, real runs and real files.

The implementation under test is a plugin written here whose output an
environment variable perturbs, so one implementation name behaves as two
builds: the baseline's and a worse one.
"""

from __future__ import annotations

import json
import os
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from cli_here import run_here
from judged_records import judged as make

from harness.buildinfo import build_info
from harness.results.diff import ChangeKind
from harness.results.gate import evaluate, format_result, junit_rows
from harness.judge.status import Status
from harness.results.store import Store, build_key

PLUGIN = textwrap.dedent("""
    import os

    from harness.impls.reference import SyncBatchNorm


    class Drifting(SyncBatchNorm):
        \"\"\"The reference; its output is scaled by 1 + SYNCBN_TEST_WORSE (a build made worse).\"\"\"

        def forward(self, input):
            out = super().forward(input)
            worse = float(os.environ.get("SYNCBN_TEST_WORSE", "0"))
            return out * (1.0 + worse) if worse else out
""")
IMPL = "tgplug:Drifting"


def small_selection(n: int) -> list[str]:
    """IDs of ``n`` cheap default cases (float32, two ranks), read from the catalog as it is today."""
    from harness import catalog

    ids = [c.id for c in catalog.select(world_sizes=[2])
           if c.dtype == "float32" and c.param_dtype == "float32" and c.groups is None]
    assert len(ids) >= n, ids
    return ids[:n]


def harness(args, tmp_path: Path, worse: str = "0"):
    """The command run in this process (its property is its exit code, output and files; tests/support/cli_here.py):
    the plugin's ranks see ``SYNCBN_TEST_WORSE`` through the environment the pool hands them."""
    (tmp_path / "tgplug.py").write_text(PLUGIN)
    env = dict(os.environ, SYNCBN_TEST_WORSE=worse,
               PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    return run_here(args, env=env, cwd=tmp_path)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """A real run of the plugin, unperturbed: its JSON output and its store."""
    tmp = tmp_path_factory.mktemp("gate")
    cases = small_selection(3)
    selection = ["--impl", IMPL, *[a for c in cases for a in ("--case", c)]]
    proc = harness(["run", *selection, "--store", str(tmp / "good"), "--format", "json"], tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (tmp / "baseline.json").write_text(proc.stdout)
    assert [r["status"] for r in json.loads(proc.stdout)] == ["pass"] * 3
    return tmp, selection, cases


def junit_cases(path: Path) -> dict:
    suite = ET.parse(path).getroot()
    return {(tc.get("classname"), tc.get("name")): [child.tag for child in tc] for tc in suite.iter("testcase")}


@pytest.mark.slow
def test_gate_passes_an_unchanged_build(baseline):
    tmp, selection, cases = baseline
    proc = harness(["gate", "--baseline", "baseline.json", *selection, "--junit", "gate.xml"], tmp)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "3 (case, impl) compared" in proc.stdout and "0 regressions, pass (exit 0)" in proc.stdout
    assert junit_cases(tmp / "gate.xml") == {(IMPL, c): [] for c in cases}


@pytest.mark.slow
def test_gate_fails_a_build_made_worse_and_writes_junit(baseline):
    tmp, selection, cases = baseline
    proc = harness(["gate", "--baseline", "baseline.json", *selection, "--junit", "worse.xml"], tmp, worse="0.01")
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert proc.stdout.count("REGRESSION") == 3 and "pass -> mismatch" in proc.stdout
    tcs = junit_cases(tmp / "worse.xml")
    assert tcs == {(IMPL, c): ["failure"] for c in cases}
    failure = ET.parse(tmp / "worse.xml").getroot().find("testcase/failure")
    assert "regression against the baseline: pass -> mismatch" in failure.get("message")
    assert "output" in failure.text and "ratio" in failure.text  # which tensor, by how much


@pytest.mark.slow
def test_gate_over_stores_and_diff_between_builds(baseline):
    """--store reads the current build's records; a store .jsonl file serves as the baseline too."""
    tmp, selection, cases = baseline
    key = build_key(build_info().torch_version, build_info().torch_git_version, "cpu", "gloo")
    good_file = tmp / "good" / f"{key}.jsonl"
    same = harness(["gate", "--baseline", str(good_file), "--store", "good"], tmp)
    assert same.returncode == 0, same.stdout + same.stderr[-2000:]

    run = harness(["run", *selection, "--store", str(tmp / "bad")], tmp, worse="0.01")
    assert run.returncode == 1, run.stderr[-3000:]
    worse = harness(["gate", "--baseline", "baseline.json", "--store", "bad", "--impl", IMPL], tmp)
    assert worse.returncode == 1 and worse.stdout.count("REGRESSION") == 3, worse.stdout + worse.stderr

    # diff: the worse records under another build's key, beside the good ones in one store.
    mixed = Store(tmp / "mixed")
    for r in Store(tmp / "good").read():
        mixed.append(r)
    for r in Store(tmp / "bad").read():
        r.torch_version, r.torch_git_version = "9.9.9+worse", "feedfacefeedface"
        mixed.append(r)
    out = harness(["diff", key[:8], "9.9", "--store", "mixed"], tmp)
    assert out.returncode == 0, out.stderr
    assert f"A: {key}" in out.stdout and "B: 9.9.9+worse-feedfacefeed-cpu-gloo" in out.stdout
    assert "new failure (3):" in out.stdout and "3 regressions" in out.stdout
    fail = harness(["diff", key[:8], "9.9", "--store", "mixed", "--fail-on-regression"], tmp)
    assert fail.returncode == 1 and fail.stdout == out.stdout
    data = json.loads(harness(["diff", key, "9.9.9", "--store", "mixed", "--format", "json"], tmp).stdout)
    assert {(c["case"], c["kind"], c["before"], c["after"]) for c in data["changes"]} == {
        (c, ChangeKind.NEW_FAILURE.value, "pass", "mismatch") for c in cases}
    unknown = harness(["diff", "nope", key, "--store", "mixed"], tmp)
    assert unknown.returncode == 2 and "'nope' matches no build" in unknown.stderr and key in unknown.stderr


def test_gate_refuses_a_baseline_with_nothing_in_common(tmp_path):
    rec = make("numerics/a/ws2", Status.PASS).to_dict()
    (tmp_path / "base.json").write_text(json.dumps([dict(rec, impl="someone-else")]))
    store = Store(tmp_path / "s")
    info = build_info()
    mine = make("numerics/a/ws2", Status.PASS)
    mine.torch_version, mine.torch_git_version = info.torch_version, info.torch_git_version
    store.append(mine)
    proc = harness(["gate", "--baseline", "base.json", "--store", "s"], tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "share no (case, impl)" in proc.stderr and "someone-else" in proc.stderr
    missing = harness(["gate", "--baseline", "nope.json", "--store", "s"], tmp_path)
    assert missing.returncode == 2 and "nope.json" in missing.stderr


# --- the gate's rules over records ------------------------------------------------------------------------

def test_the_gate_fails_when_results_the_baseline_ran_are_missing():
    baseline = [make(f"a/{i}/ws2", Status.PASS) for i in range(5)] + [make("a/skipped/ws2", Status.SKIPPED)]
    current = baseline[:2]  # a run that stopped early, or a smaller selection
    result = evaluate(baseline, current)
    assert result.exit_code == 1 and not result.regressions
    assert sorted(c.case for c in result.missing) == ["a/2/ws2", "a/3/ws2", "a/4/ws2"]  # not the skipped one
    text = format_result(result, "base.json")
    assert text.count("MISSING") == 3 and "gate: 0 regressions, 3 missing" in text and "(exit 1)" in text
    assert "--allow-missing" in text
    rows = {r["name"]: r["outcome"] for r in junit_rows(result)}
    assert rows["a/3/ws2"] == "failure" and rows["a/skipped/ws2"] == "skipped" and rows["a/0/ws2"] == "pass"
    allowed = evaluate(baseline, current, allow_missing=True)
    assert allowed.exit_code == 0
    assert "3 missing (allowed by --allow-missing)" in format_result(allowed, "base.json")


@pytest.mark.slow
def test_gate_of_a_partial_store_fails_on_the_cli_unless_allowed(baseline):
    tmp, selection, cases = baseline
    partial = harness(["run", "--impl", IMPL, "--case", cases[0], "--store", str(tmp / "partial")], tmp)
    assert partial.returncode == 0, partial.stderr[-2000:]
    gated = harness(["gate", "--baseline", "baseline.json", "--store", "partial", "--junit", "partial.xml"], tmp)
    assert gated.returncode == 1, gated.stdout + gated.stderr
    assert gated.stdout.count("MISSING") == 2 and "0 regressions, 2 missing" in gated.stdout
    assert sorted(k[1] for k, v in junit_cases(tmp / "partial.xml").items() if v == ["failure"]) == sorted(cases[1:])
    allowed = harness(["gate", "--baseline", "baseline.json", "--store", "partial", "--allow-missing"], tmp)
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr


def test_a_garbage_baseline_says_what_it_is_not(tmp_path):
    (tmp_path / "log.txt").write_text("Traceback (most recent call last):\n  boom\n")
    proc = harness(["gate", "--baseline", "log.txt", "--store", "s"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "is not a run's JSON output" in proc.stderr and "dropping" not in proc.stderr
