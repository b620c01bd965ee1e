"""Packing the suite's work folder: the few files a lent machine sends back, whatever happened before.

Design: a work folder made by real parts (steps run by the runner, one passing, one failing, one stopped at its
limit; a store written by a real `run` on CPU), then packed; the output folder is read as the device tool's
rules read it (at most 8 files, none deeper than two folders, names of letters, digits, '.', '_', '-').
"""

from __future__ import annotations

import os
import re
import tarfile

from cli_here import run_here

from harness.gpu_suite.machine import Machine, Provenance
from harness.gpu_suite.pack import FILES, clear, pack
from harness.gpu_suite.runner import run_steps
from harness.gpu_suite.steps import Step

NAME = re.compile(r"^[A-Za-z0-9._-]+$")
NO_GPU = Machine(gpus=(), driver=None, torch="x", torch_git=None, torch_cuda=None, nvcc=None, cuda_home=None,
                 python="3", python_executable="python3", cpus=2, platform="Linux", nccl=None, ncu=None,
                 harness=Provenance(None, None, "unknown"))


def test_a_failed_and_a_stopped_step_still_leave_every_file(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    proc = run_here(["run", "--device", "cpu", "--impl", "reference", "--case", "numerics/offset-1e3/ws2",
                     "--store", str(work / "results")])  # a real record to count (tests/support/cli_here.py)
    assert proc.returncode == 0, proc.stderr[-2000:]
    steps = [Step("ok", ("sh", "-c", "echo '[]' "), "ok.txt", 10, stdout="bench.json"),
             Step("bad", ("sh", "-c", "echo broken; exit 4"), "bad.txt", 10),
             Step("slow", ("sleep", "60"), "slow.txt", 1)]
    run_steps(steps, work, dict(os.environ), 300, header={"gpus": []}, echo=lambda _: None)
    (out).mkdir()
    (out / "console.txt").write_text("console\n")
    (out / "summary.md").write_text("an old summary\n")
    clear(out)
    assert sorted(p.name for p in out.iterdir()) == ["console.txt"]  # old results gone, the console kept
    written = pack(work, out, NO_GPU, "2026-11-26")
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(p.name for p in written) and len(names) <= 8 and set(names) <= set(FILES)
    assert all(NAME.match(n) and (out / n).is_file() and (out / n).stat().st_size < 16 * 2**20 for n in names)
    summary = (out / "summary.md").read_text()
    assert "| bad | failed | 4 |" in summary and "| slow | timed out |" in summary
    assert "| reference (-) | gloo | 1 | 1 | 0 |" in summary  # the store's record, counted by status
    rows = (out / "records.csv").read_text().splitlines()
    assert rows[0].startswith("case,family,impl,mode,device,backend,status,known,worst_ratio")
    assert rows[1].startswith("numerics/offset-1e3/ws2,numerics,reference,,cpu,gloo,pass,,") and len(rows) == 2
    with tarfile.open(out / "suite.tar.gz") as tar:
        members = tar.getnames()
    assert "gpu-suite/logs/bad.txt" in members and "gpu-suite/steps.json" in members
    assert any(m.startswith("gpu-suite/results/") and m.endswith(".jsonl") for m in members)


def test_packing_an_empty_work_folder_says_so(tmp_path):
    (tmp_path / "work").mkdir()
    pack(tmp_path / "work", tmp_path / "out", None, "today")
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "no machine.json" in summary and "no steps ran" in summary and "no records" in summary
    assert "## CUDA kernel tests (`pytest -m cuda`)\n\nnot run" in summary
