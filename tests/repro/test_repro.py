"""``repro --long``: the written file reproduces a defect standalone (no harness import), and passes without it.

Each file is written by the real CLI (which runs the case with the harness
first, for the header) and then run with ``python FILE`` in a fresh process
whose ``PYTHONPATH`` starts with a decoy ``harness`` package that raises on
import: the file must not need the harness.
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli_here import run_here

from harness.judge import oracle
from harness.repro import Form

CASE = "allgather-shape/uneven-2-6/float64-float64/contiguous/ws2"


from syncbnplug_template import PLUGIN  # noqa: E402


@pytest.fixture
def plugins(tmp_path) -> Path:
    """Two plugin modules (correct, biased running variance) and a decoy harness package."""
    d = tmp_path / "plugins"
    d.mkdir()
    (d / "good_bn.py").write_text(PLUGIN.format(version="1", biased=False, broken=""))
    (d / "biased_bn.py").write_text(PLUGIN.format(version="5", biased=True, broken=""))
    decoy = tmp_path / "decoy" / "harness"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text("raise ImportError('the repro imported the harness')\n")
    return d


def write(impl: str, out: Path, *extra: str, pythonpath: str = "") -> subprocess.CompletedProcess:
    """``repro --long`` run in this process (tests/support/cli_here.py): the property is the file it writes."""
    env = {**os.environ, "PYTHONPATH": pythonpath}
    return run_here(["repro", CASE, "--impl", impl, "-o", str(out), "--long", *extra], env=env)


def run_standalone(path: Path, plugin_dir: Path, *, launcher=(), cwd=None) -> subprocess.CompletedProcess:
    decoy = plugin_dir.parent / "decoy"
    # TMPDIR: under torchrun, torch's elastic agent makes a log folder there and leaves it behind.
    env = {**os.environ, "PYTHONPATH": f"{decoy}{os.pathsep}{plugin_dir}", "TMPDIR": str(path.parent)}
    return subprocess.run([*launcher, str(path)], capture_output=True, text=True, timeout=300, env=env,
                          cwd=cwd or path.parent)


@pytest.mark.sweep(23)
@pytest.mark.slow
def test_repro_fails_for_the_defect_and_passes_without_it(plugins, tmp_path):
    bad_file, good_file = tmp_path / "repro_biased.py", tmp_path / "repro_good.py"
    proc = write("biased_bn:SyncBatchNorm", bad_file, pythonpath=str(plugins))
    assert proc.returncode == 0, proc.stderr
    assert "observed mismatch" in proc.stdout
    text = bad_file.read_text()
    head = text.split('"""', 1)[0]
    import torch

    assert "# Observed: mismatch" in head and "running_var" in head
    assert f"torch {torch.__version__} (git {torch.version.git_version})" in head
    assert f"# Found with: syncbn-harness check --impl biased_bn:SyncBatchNorm --case {CASE}" in head
    assert not re.search(r"^\s*(import|from)\s+harness\b", text, re.M)
    # Built from the harness's own source text, not a rewrite of the math.
    assert inspect.getsource(oracle.run_oracle) in text

    bad = run_standalone(bad_file, plugins, launcher=(sys.executable,))
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "FAIL: biased_bn:SyncBatchNorm disagrees with the float64 oracle" in bad.stdout
    assert "running_var: max abs err" in bad.stdout and "the repro imported the harness" not in bad.stderr

    assert write("good_bn:SyncBatchNorm", good_file, pythonpath=str(plugins)).returncode == 0
    good = run_standalone(good_file, plugins, launcher=(sys.executable,))
    assert good.returncode == 0, good.stdout + good.stderr
    assert good.stdout.startswith("PASS: good_bn:SyncBatchNorm agrees")


@pytest.mark.slow(13)
def test_repro_runs_under_torchrun(plugins, tmp_path):
    out = tmp_path / "repro_biased.py"
    assert write("biased_bn:SyncBatchNorm", out, "--no-run", pythonpath=str(plugins)).returncode == 0
    torchrun = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2")
    proc = run_standalone(out, plugins, launcher=torchrun)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert proc.stdout.count("FAIL: biased_bn:SyncBatchNorm") == 1  # rank 0 prints, every rank fails
    assert "running_var" in proc.stdout


@pytest.mark.slow(11)
def test_repro_of_torch_targets_cuda_and_says_why(plugins, tmp_path):
    out = tmp_path / "repro_torch.py"
    proc = write("torch", out, "--no-run")
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert "DEVICE = 'cuda'" in text and "BACKEND = 'nccl'" in text and "cpu-emulation" in text
    assert "return torch.nn.SyncBatchNorm" in text
    ran = run_standalone(out, plugins, launcher=(sys.executable,))
    import torch

    if not torch.cuda.is_available():
        assert ran.returncode == 2 and "no GPU is visible" in ran.stderr
    elif torch.cuda.device_count() < 2:
        assert ran.returncode == 2 and "nccl cannot share one GPU" in ran.stderr
    else:  # torch's SyncBatchNorm is right on this float64 case: the file runs it on two GPUs and says so
        assert ran.returncode == 0 and ran.stdout.startswith("PASS: torch agrees"), ran.stdout + ran.stderr
    refused = write("torch", out, "--device", "cpu", "--no-run")
    assert refused.returncode == 2 and "--device cuda" in refused.stderr and "short form" in refused.stderr


def test_repro_of_reference_says_it_is_not_standalone(tmp_path):
    out = tmp_path / "repro_ref.py"
    proc = write("reference", out, "--no-run", "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert "NOT standalone" in text.split('"""', 1)[0] and 'import_module("harness.impls.reference")' in text


def test_repro_refuses_an_ambiguous_case(tmp_path):
    proc = run_here(["repro", "allgather-shape/*", "--impl", "torch", "--no-run"], cwd=tmp_path)
    assert proc.returncode == 2 and "give one case ID" in proc.stderr


@pytest.mark.slow
@pytest.mark.sweep(78)
@pytest.mark.parametrize("case", ["ddp/cnn-sgd/broadcast-buffers-True-default-plain/float32/ws2",
                                  "conversion/config/float32/uneven-3-5/ws2",
                                  "conversion/checkpoint-revert/config/float32/ws2"])
def test_repro_of_a_network_case_is_standalone_too(plugins, tmp_path, case, write_here):
    """Scenarios that use other scenario modules (the networks, the user models, the converter checks) are
    written into the file with them: it still imports no harness, and judges as the harness does."""
    for plugin, code, word in (("good_bn", 0, "PASS"), ("biased_bn", 1, "FAIL")):
        out = tmp_path / f"repro_{plugin}.py"
        written = write_here(case, f"{plugin}:SyncBatchNorm", out, str(plugins), long=True)
        assert written.form is Form.LONG and written.record is not None
        assert not re.search(r"^\s*(import|from)\s+harness\b", out.read_text(), re.M)
        ran = run_standalone(out, plugins, launcher=(sys.executable,))
        assert ran.returncode == code, ran.stdout + ran.stderr
        assert ran.stdout.startswith(f"{word}: {plugin}:SyncBatchNorm"), ran.stdout
        assert "running_var" in ran.stdout or code == 0


def test_exit_1_without_the_files_own_line_is_a_broken_file_not_the_symptom(tmp_path):
    from harness.repro import Written

    broke = Written(tmp_path / "r.py", Form.SHORT, exit_code=1, output="Traceback ...\nImportError: no module x")
    assert broke.verdict().startswith("exits 1 without its 'SYMPTOM SHOWS' line: it broke before judging")
    shown = Written(tmp_path / "r.py", Form.SHORT, exit_code=1, output="SYMPTOM SHOWS (crash): ...", judged=True)
    assert shown.verdict() == "shows the symptom standalone (exit 1)"


def test_the_file_takes_the_torchrun_path_only_when_torchrun_started_it(monkeypatch):
    """torchrun sets TORCHELASTIC_RUN_ID, RANK and WORLD_SIZE; RANK and WORLD_SIZE left by something else must
    not send the file to a rendezvous nobody serves (the harness's own rule, engine.launcher.under_torchrun)."""
    from harness.engine import launcher
    from harness.repro import standalone

    for var in ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert not standalone.under_torchrun() and not launcher.under_torchrun()
    monkeypatch.delenv("RANK")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    assert not standalone.under_torchrun() and not launcher.under_torchrun()
    monkeypatch.setenv("RANK", "0")
    assert standalone.under_torchrun() and launcher.under_torchrun()


@pytest.mark.slow(18)
def test_a_long_repro_of_a_case_without_a_process_group_never_makes_one(plugins, tmp_path):
    """The file's rank joins nothing (``BACKEND == "no-group"``): a SyncBN that needs a group fails there alone."""
    support = Path(__file__).resolve().parents[1] / "support"
    for module in ("textbook.py", "inference_defects.py"):
        (plugins / module).write_text((support / module).read_text())
    case = "no-group/layer/default/float32/2d/ws1/no-group"
    files = {}
    for name in ("inference_defects:TrainsOnlyInAGroup", "textbook:TextbookSyncBN"):
        files[name] = tmp_path / f"repro_{name.split(':')[1]}.py"
        env = {**os.environ, "PYTHONPATH": str(plugins)}
        proc = run_here(["repro", case, "--impl", name, "-o", str(files[name]), "--long", "--no-run"], env=env)
        assert proc.returncode == 0, proc.stderr
    bad = run_standalone(files["inference_defects:TrainsOnlyInAGroup"], plugins, launcher=(sys.executable,))
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "Default process group has not been initialized" in bad.stdout + bad.stderr
    assert "the repro imported the harness" not in bad.stderr
    good = run_standalone(files["textbook:TextbookSyncBN"], plugins, launcher=(sys.executable,))
    assert good.returncode == 0, good.stdout + good.stderr
