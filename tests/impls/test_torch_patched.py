"""``--impl torch@PATH``: a patched copy of torch's SyncBatchNorm run exactly as torch is.

Design: the copies are the installed torch's own two files, copied into a folder laid out like a checkout,
unmodified or with one line changed, and run through the real CLI over real process groups (cpu-emulation).
The unmodified copy must get torch's verdicts and known issues case for case; a copy that drops ``qconfig`` in
its converter must fail where torch fails only as known.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from cli_here import run_here

from harness.impls import resolve
from harness.impls.torch_patched import FILES, PatchedTorchImpl
from harness.results import known_issues
from harness.judge.status import Status
from harness.results.records import Record

SAMPLE = ["allgather-shape/empty-0-5/*", "allgather-shape/uneven-2-6/float32-float32/contiguous/ws2",
          "conversion/nested/*", "degenerate/one-value-*/float32-*", "mixed-precision/no-running-stats/*",
          "ddp/cnn-sgd/broadcast-buffers-False-static-graph-no-sync-2/*", "process-group/split-empty-0-12/ws3"]


def copy_of_torch(folder: Path, edit=None) -> Path:
    """torch's batchnorm.py and _functions.py, as installed, under ``folder``/torch/nn/modules (``edit`` applied to
    batchnorm.py's text)."""
    here = Path(torch.nn.modules.batchnorm.__file__).parent
    dest = folder / "torch" / "nn" / "modules"
    dest.mkdir(parents=True)
    for rel in FILES:
        shutil.copyfile(here / Path(rel).name, dest / Path(rel).name)
    if edit:
        path = dest / "batchnorm.py"
        before = path.read_text()
        after = edit(before)
        assert after != before, "the edit changed nothing"
        path.write_text(after)
    return folder


def run(impl: str, patterns) -> tuple[int, dict]:
    proc = run_here(["run", "--impl", impl, *(a for p in patterns for a in ("--case", p)), "--format", "json"])
    return proc.returncode, {r["case"]: r for r in json.loads(proc.stdout or "[]")}


@pytest.mark.slow(40)
def test_an_unmodified_copy_gets_torchs_verdicts_and_known_issues(tmp_path):
    copy = copy_of_torch(tmp_path / "checkout")
    code_torch, want = run("torch", SAMPLE)
    code_copy, got = run(f"torch@{copy}", SAMPLE)
    assert want and set(got) == set(want)
    assert code_copy == code_torch == 0
    for case, w in want.items():
        g = got[case]
        assert (g["status"], bool(g["known_issue"] and g["known_issue"]["matched"]), g["mode"]) == (
            w["status"], bool(w["known_issue"] and w["known_issue"]["matched"]), w["mode"]), case
    assert {r["status"] for r in got.values()} >= {"pass", "mismatch", "crash", "error"}
    assert all(r["impl"] == f"torch@{copy}" for r in got.values())


@pytest.mark.slow(20)
def test_a_copy_whose_converter_drops_qconfig_fails_beside_the_known_issue(tmp_path):
    """The mutant of the issue: on conversion/nested/* torch fails as known (the shared module split); the copy
    fails that way and loses qconfig too, which no entry explains: exit 1, naming it."""
    copy = copy_of_torch(tmp_path / "checkout", lambda t: t.replace("module_output.qconfig = module.qconfig",
                                                                       "pass  # qconfig dropped"))
    code, got = run(f"torch@{copy}", ["conversion/nested/*"])
    assert code == 1 and got
    for r in got.values():
        assert r["status"] == "mismatch" and not r["known_issue"]["matched"]
        assert any("qconfig lost in conversion" in u for u in r["known_issue"]["unexpected"]), r["known_issue"]
        assert r["message"].startswith("unexpected beside a known issue: mismatch convert.")


def test_a_path_without_torchs_files_is_a_usage_error(tmp_path):
    proc = run_here(["run", "--impl", f"torch@{tmp_path}", "--case", "numerics/offset-1e3/ws2"])
    assert proc.returncode == 2
    assert "holds neither torch/nn/modules/_functions.py nor torch/nn/modules/batchnorm.py" in proc.stderr
    proc = run_here(["run", "--impl", "torch@", "--case", "numerics/offset-1e3/ws2"])
    assert proc.returncode == 2 and "give the folder of your copy" in proc.stderr


def test_the_copy_is_torch_for_known_issues_and_a_name_of_its_own_for_records(tmp_path):
    copy = copy_of_torch(tmp_path / "c")
    impl = resolve(f"torch@{copy}")
    assert isinstance(impl, PatchedTorchImpl) and impl.name == f"torch@{copy}"
    cls = impl.syncbn_class()
    assert cls is not torch.nn.SyncBatchNorm and cls.__name__ == "SyncBatchNorm"
    assert cls.forward.__code__.co_filename == str(copy / "torch/nn/modules/batchnorm.py")
    r = Record(case="conversion/nested/float32/uneven-3-5/ws2", family="conversion", params={}, impl=impl.name,
               status=Status.PASS, torch_version=torch.__version__)
    assert known_issues.annotate(r).known_issue.now_passes  # torch's entry covers the copy
    other = Record(case=r.case, family="conversion", params={}, impl="torchvariant:X", status=Status.PASS,
                   torch_version=torch.__version__)
    assert known_issues.annotate(other).known_issue is None  # only the torch@ prefix stands for torch
