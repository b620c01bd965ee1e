"""Plugins: MODULE:ATTR and the entry-point group, with clear errors when they do not import."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_here import run_here

from harness import catalog
from harness.engine.session import RunOptions, resolve_impls, run_selection
from harness.errors import ImplUnavailable, UsageError
from harness.impls import resolve
from harness.judge.status import Status

SUPPORT = str(Path(__file__).resolve().parents[1] / "support")


def _env(tmp_path=None):
    paths = [SUPPORT] + ([str(tmp_path)] if tmp_path else [])
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths + [os.environ.get("PYTHONPATH", "")]))


def test_malformed_plugin_name_is_a_usage_error():
    with pytest.raises(UsageError, match="MODULE:ATTR"):
        resolve("justamodule:")


def test_import_failure_names_the_module_and_the_exception(tmp_path, monkeypatch):
    (tmp_path / "brokenplug.py").write_text("raise ImportError('no CUDA toolkit for this plugin')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImplUnavailable, match="brokenplug.*ImportError: no CUDA toolkit"):
        resolve_impls(["brokenplug:SyncBN"])
    (tmp_path / "emptyplug.py").write_text("x = 1\n")
    with pytest.raises(ImplUnavailable, match="has no attribute 'SyncBN'"):
        resolve_impls(["emptyplug:SyncBN"])


@pytest.mark.slow
def test_cli_exit_codes_for_a_plugin_that_does_not_import(tmp_path):
    (tmp_path / "brokenplug.py").write_text("import not_a_real_dependency\n")
    sel = ["--impl", "brokenplug:SyncBN", "--case", "numerics/offset-1e3/ws2"]
    run = run_here(["run"] + sel, env=_env(tmp_path))  # the command's code; check's mapping is its process's
    assert run.returncode == 2 and "ModuleNotFoundError" in run.stderr and "brokenplug" in run.stderr
    check = subprocess.run([sys.executable, "-m", "harness", "check"] + sel, env=_env(tmp_path), capture_output=True,
                           text=True, timeout=300)
    assert check.returncode == 125, check.stderr


@pytest.mark.slow
def test_correct_plugin_passes_and_defective_plugin_fails(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", _env()["PYTHONPATH"])
    cases = catalog.select(["allgather-shape/uneven-2-6/float32-float32/contiguous/ws2",
                            "allgather-shape/uneven-1-2-5/float32-float32/contiguous/ws3"])
    records = list(run_selection(
        cases, resolve_impls(["textbook:TextbookSyncBN", "defects:EqualWeightMerge"]), RunOptions()))
    by_impl = {(r.impl, r.case): r.status for r in records}
    # Equal weights in the merge are wrong exactly where the ranks' batches differ in size: both cases, on the
    # output and the running statistics alike.
    assert by_impl == {(impl, case.id): Status.PASS if impl.startswith("textbook") else Status.MISMATCH
                       for impl in ("textbook:TextbookSyncBN", "defects:EqualWeightMerge") for case in cases}, by_impl
    wrong = {r.case: r.metrics for r in records if r.impl.startswith("defects")}
    for case, metrics in wrong.items():
        failing = {name for name, m in metrics.items() if not m.ok}
        assert {f"rank{r}.step0.train.{t}" for r in (0, 1) for t in ("output", "running_mean")} <= failing, \
            (case, sorted(failing))


def test_entry_point_plugins_are_listed(tmp_path, monkeypatch):
    """A distribution declaring the syncbn_harness.impls group shows up by name."""
    dist = tmp_path / "myplug-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: myplug\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[syncbn_harness.impls]\nmybn = textbook:TextbookSyncBN\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(SUPPORT)
    from harness.impls import known_names

    assert "mybn" in known_names()
    impl = resolve("mybn")
    assert impl.name == "mybn" and impl.key == "mybn"
    impl.check_available()
    assert impl.capabilities.convert  # textbook has convert_sync_batchnorm


@pytest.mark.slow
@pytest.mark.usefixtures("support_on_path")
def test_a_layer_without_bias_runs_where_the_constructor_takes_the_keyword_and_is_unsupported_elsewhere():
    """bias=False: the reference, torch (this build has the keyword) and the textbook SyncBN run it and pass; a
    plugin whose constructor has no ``bias`` and apex (whatever its state) declare it unsupported, with the reason.
    """
    case = catalog.select(["module-config/bias-off/ws2"])[0]
    assert not case.bias
    assert "bias=False" in resolve("float32_syncbn:Float32SyncBN").unsupported_reason(case, "cpu")
    assert not resolve("apex").capabilities.bias_off and not resolve("detectron2").capabilities.bias_off
    names = ["reference", "torch", "textbook:TextbookSyncBN", "gather:GatherSyncBN"]
    records = {r.impl: r for r in run_selection([case], resolve_impls(names), RunOptions(timeout=60, diagnose=False))}
    assert {r.status for r in records.values()} == {Status.PASS, Status.UNSUPPORTED}
    assert records["gather:GatherSyncBN"].status is Status.UNSUPPORTED
    assert "bias=False (a weight without a bias)" in records["gather:GatherSyncBN"].message
    for name in ("reference", "torch", "textbook:TextbookSyncBN"):
        r = records[name]
        assert r.status is Status.PASS, (name, r.message)
        judged = {k.split(".", 2)[-1] for k in r.metrics}
        assert "train.grad_weight" in judged and "train.grad_bias" not in judged, sorted(judged)
