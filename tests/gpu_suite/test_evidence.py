"""A GPU run's raw files filed in the repository, and every table a page cites re-derived from them.

Design: a work folder made by real parts (a real `run` on CPU into a store, steps run by the runner, the repro
and NCCL-probe modules run as they run on a GPU machine), packed as the suite packs it, filed as a developer
files it; then pages citing its tables are checked, edited and refreshed. The last test holds
docs/gpu-results.md to the runs filed in docs/gpu-runs/.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
from cli_here import run_here

from harness.errors import UsageError
from harness.gpu_suite import evidence, nccl_probe, repros, tables
from harness.gpu_suite.machine import Gpu, Machine, Provenance
from harness.gpu_suite.pack import pack
from harness.gpu_suite.runner import run_steps
from harness.gpu_suite.steps import Step

ROOT = Path(__file__).resolve().parents[2]
BENCH = [{"shape": "N2 C64 2-D float32", "dtype": "float32", "layout": "contiguous", "shape_dims": [2, 64],
          "ops": {op: {"reference_ms": 0.01, "torch_ms": 0.01, "reference_over_torch": r} for op, r in
                  zip(tables.BENCH_OPS, (0.9, 1.0, 1.1, 1.15, 1.19))},
          "copy_gbps": 1000.0, "stats_gbps": 700.0, "stats_over_copy_bandwidth": 0.7, "reference_over_torch": 1.1,
          "sequence_over_torch": 1.05},
         {"shape": "N16 C256 56x56 float16 channels_last", "dtype": "float16", "layout": "channels_last",
          "shape_dims": [16, 256, 56, 56],
          "ops": {op: {"reference_ms": 0.1, "torch_ms": 0.1, "reference_over_torch": 1.3} for op in tables.BENCH_OPS},
          "copy_gbps": 3000.0, "stats_gbps": 900.0, "stats_over_copy_bandwidth": 0.3, "reference_over_torch": 1.3,
          "sequence_over_torch": 1.3}]


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """What a GPU machine sends back, made here by the same parts."""
    base = tmp_path_factory.mktemp("run")
    work, out = base / "work", base / "out"
    work.mkdir()
    proc = run_here(["run", "--device", "cpu", "--impl", "reference", "--case", "numerics/offset-1e3/ws2",
                     "--store", str(work / "results")])
    assert proc.returncode == 0, proc.stderr[-2000:]
    shows = base / "shows.py"
    shows.write_text("import sys\nprint('SYMPTOM SHOWS (mismatch): off | by 1')\nsys.exit(1)\n")
    assert repros.main(["--out", str(work / "repros.json"), "--logs", str(work / "logs" / "repros"),
                        str(shows)]) == 0
    nccl_probe.main(["--out", str(work / "nccl-probe.json")])
    (work / "fidelity.md").write_text("torch: 3 cases compared, 3 agree, 0 disagree (0 emulated only, 0 native "
                                      "only)\n")
    steps = [Step("bench kernels", ("sh", "-c", f"echo '{json.dumps(BENCH)}'"), "bench.txt", 10, stdout="bench.json"),
             Step("ncu profile", ("true",), "ncu.txt", 10, skip="no Nsight Compute (ncu) on this machine")]
    run_steps(steps, work, dict(os.environ), 300, header={"gpus": []}, echo=lambda _: None)
    machine = Machine(gpus=(Gpu("NVIDIA H200", "9.0", 139.8, 132),), driver="580.95", torch="2.11.0+cu130",
                      torch_git="70d99e998b49aa", torch_cuda="13.0", nvcc=None, cuda_home="/usr/local/cuda",
                      python="3.11.7", python_executable=sys.executable, cpus=16, platform="Linux", nccl=(2, 28, 9),
                      ncu=None, harness=Provenance("abc123", True, "git"))
    out.mkdir()
    (out / "console.txt").write_text("[gpu-suite] what the suite printed\n")  # the suite's own, beside the pack
    pack(work, out, machine, "2026-11-28 20:00 UTC")
    return out


def test_a_packed_run_is_filed_with_its_raw_files_and_calls(packed, tmp_path):
    into = tmp_path / "docs" / "gpu-runs" / "2026-11-28-h200"
    evidence.file_run(packed, into, ["bash .ci/gpu-suite.sh $OUT --repro docs/findings"])
    names = sorted(p.relative_to(into).as_posix() for p in into.rglob("*") if p.is_file())
    assert names == ["bench.json", "calls.md", "console.txt", "fidelity.md", "machine.json", "nccl-probe.json",
                     "records.csv", "repro-logs/shows.txt", "repros.json", "steps.json", "summary.md"]
    assert "bash .ci/gpu-suite.sh $OUT --repro docs/findings" in (into / "calls.md").read_text()
    assert json.loads((into / "machine.json").read_text())["harness"]["commit"] == "abc123"
    with pytest.raises(UsageError, match="already holds files"):
        evidence.file_run(packed, into, [])  # a filed run is never overwritten
    with pytest.raises(UsageError, match="not a packed GPU run"):
        evidence.file_run(tmp_path, tmp_path / "elsewhere", [])


def test_a_filed_runs_repro_verdicts_become_runs_of_record(packed, tmp_path):
    """Each verdict keeps the file's sha256 as it ran: a claim "exits 1 on CUDA" about the file as it is now
    is checked against it (tests/repro/test_findings_files.py)."""
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        import tomli as tomllib

    into = tmp_path / "docs" / "gpu-runs" / "2026-11-28-h200"
    evidence.file_run(packed, into, [])
    runs = tmp_path / "runs.toml"
    runs.write_text("# runs of record\n")
    assert evidence.record_repro_runs(into, runs, tmp_path) == 1
    assert evidence.record_repro_runs(into, runs, tmp_path) == 0  # recorded once
    (run,) = tomllib.loads(runs.read_text())["run"]
    verdict = json.loads((into / "repros.json").read_text())[0]
    assert (run["file"], run["exit"], run["sha256"], run["date"]) == ("shows.py", 1, verdict["sha256"],
                                                                      "2026-11-28")
    assert run["line"] == "SYMPTOM SHOWS (mismatch): off | by 1" and run["commit"] == "abc123"
    assert run["where"] == "cuda" and run["machine"].startswith("NVIDIA H200 (sm_90)")
    assert (tmp_path / run["log"]).read_text().strip().endswith(run["line"])


def test_every_table_is_made_from_the_raw_files(packed, tmp_path):
    evidence.file_run(packed, tmp_path / "filed", [])
    packed = tmp_path / "filed"
    assert "| NVIDIA H200 (sm 9.0, 139.8 GiB, 132 SMs) |" in tables.render("machine", packed)
    assert "commit abc123 (clean tree; from git)" in tables.render("machine", packed)
    assert "| ncu profile | not run |  | 0 | 0 | no Nsight Compute (ncu) on this machine |" in tables.render(
        "steps", packed)
    assert "| reference (-) | gloo | 1 | 1 |" in tables.render("records", packed)
    bench = tables.render("bench", packed)
    assert "| N2 C64 2-D float32 | 0.90 | 1.00 | 1.10 | 1.15 | 1.19 | 1.05 | 0.70 (700 of 1000 GB/s) | yes |" in bench
    assert "met on 1 of 2 shapes; worst op ratio 1.30" in bench
    assert "| `shows.py` | shows | 1 |" in tables.render("repros", packed)
    assert "off \\| by 1" in tables.render("repros", packed)  # a pipe in what a file printed stays in its cell
    assert tables.render("nccl", packed).startswith("not probed")  # no GPU here
    with pytest.raises(KeyError, match="one of machine, steps"):
        tables.render("benchmark", packed)


def test_a_page_citing_a_run_is_checked_and_refreshed(packed, tmp_path):
    root = tmp_path
    evidence.file_run(packed, root / "runs" / "r1", [])
    page = root / "page.md"
    body = tables.render("bench", root / "runs" / "r1")
    page.write_text(f"# Results\n\n<!-- table: runs/r1 bench -->\n{body}\n<!-- end table -->\n\nprose\n\n"
                    f"<!-- table: runs/r1 records -->\nstale\n<!-- end table -->\n")
    assert evidence.check_page(page, root) == ["page.md: table records of runs/r1 differs from its raw files"]
    assert evidence.refresh_page(page, root) == 1
    assert evidence.check_page(page, root) == []
    page.write_text(page.read_text().replace("0.90 |", "0.80 |"))  # a figure edited by hand
    assert evidence.check_page(page, root) == ["page.md: table bench of runs/r1 differs from its raw files"]
    page.write_text(page.read_text() + "\n<!-- table: runs/r1 steps -->\nno end\n")
    assert "3 tables open but 2 are well formed" in evidence.check_page(page, root)[0]
    page.write_text(page.read_text().replace("<!-- table: runs/r1 steps -->\nno end\n", ""))
    empty = page.read_text() + "<!-- table: runs/r1 steps -->\n<!-- end table -->\n"  # an empty block is filled
    page.write_text(empty)
    # both the hand-edited bench table and the empty block are made again from the files
    assert evidence.refresh_page(page, root) == 2 and evidence.check_page(page, root) == []
    page.write_text(page.read_text().replace("runs/r1 bench", "runs/gone bench"))
    assert "cites runs/gone, which does not exist" in evidence.check_page(page, root)[0]


def test_the_command_files_a_run_and_checks_a_page(packed, tmp_path):
    into = tmp_path / "filed"
    proc = run_here(["gpu-evidence", str(packed), "--into", str(into), "--call", "one", "--call", "two"])
    assert proc.returncode == 0, proc.stderr
    assert "1.\n\n```\none\n```" in (into / "calls.md").read_text()
    page = tmp_path / "page.md"
    page.write_text(f"<!-- table: {into} steps -->\nold\n<!-- end table -->\n")
    proc = run_here(["gpu-evidence", "--check", str(page)])
    assert proc.returncode == 1 and "differs from its raw files" in proc.stderr
    assert run_here(["gpu-evidence", "--refresh", str(page)]).returncode == 0
    assert run_here(["gpu-evidence", "--check", str(page)]).returncode == 0
    assert run_here(["gpu-evidence"]).returncode == 2


def test_gpu_results_cites_every_filed_run_and_agrees_with_its_files():
    """docs/gpu-results.md's tables are those of the raw files in docs/gpu-runs/; every run is linked from the page,
    and every suite run (one with steps.json) has its tables there."""
    page = ROOT / "docs" / "gpu-results.md"
    text = page.read_text()
    filed = ROOT / "docs" / "gpu-runs"
    runs = sorted(p for p in filed.iterdir() if p.is_dir()) if filed.is_dir() else []
    assert runs, "no GPU run is filed in docs/gpu-runs/"
    cited = {run for run, _, _ in evidence.blocks(text)}
    assert not [r.name for r in runs if f"gpu-runs/{r.name}/" not in text and f"docs/gpu-runs/{r.name}" not in cited]
    assert {f"docs/gpu-runs/{r.name}" for r in runs if (r / "steps.json").is_file()} <= cited
    for run in runs:
        assert (run / "calls.md").is_file(), f"{run.name} does not say how it was made (calls.md)"
        if (run / "steps.json").is_file():  # a suite's run: its summary and machine, with the harness commit
            for name in ("summary.md", "machine.json"):
                assert (run / name).is_file(), f"{run.name} lacks {name}"
            assert json.loads((run / "machine.json").read_text())["harness"]["commit"], f"{run.name}: no commit"
    pages = [p for p in (ROOT / "docs").glob("*.md") if evidence.blocks(p.read_text())]
    assert page in pages and len(pages) >= 2  # gpu-results.md, reference-kernels.md
    assert [problem for p in pages for problem in evidence.check_page(p, ROOT)] == []


def test_the_filed_machine_files_have_the_shape_a_machine_writes():
    """``machine.json`` is written from :class:`Machine`; the runs filed before it was a dataclass read the same."""
    one = Machine(gpus=(Gpu("g", "9.0", 1.0, 1),), driver=None, torch="t", torch_git=None, torch_cuda=None,
                  nvcc=None, cuda_home=None, python="3", python_executable="p", cpus=1, platform="x", nccl=(2, 28, 9),
                  ncu=None, harness=Provenance(None, None, "s"))
    written = json.loads(json.dumps(one.to_json()))
    assert written["gpus"] == [asdict(one.gpus[0])] and written["nccl"] == [2, 28, 9]
    filed = sorted(ROOT.joinpath("docs", "gpu-runs").glob("*/machine.json"))
    assert filed, "no machine.json filed under docs/gpu-runs/"
    for path in filed:
        got = json.loads(path.read_text())
        assert set(got) == set(written), f"{path}: {sorted(set(got) ^ set(written))}"
        assert all(set(g) == set(written["gpus"][0]) for g in got["gpus"]), path
        assert set(got["harness"]) == set(written["harness"]), path
