"""The overlay bisection's default rules over pytorch-shaped histories: Python or compiled asked first,
relevance to SyncBN's path, approximate overlays, two binaries. Real git, real runs of the installed torch.

Each history's base commit holds the installed torch's Python files (``torch_history``), so an overlay of
it is the installed torch; compiled files are stand-ins nothing compiles. A tested commit costs a whole
``run`` in a child (a few seconds): every test bounds how many ran by ceil(log2 N) + 3.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys

import pytest
import torch

from harness.bisect.bisector import Outcome, Verdict
from harness.bisect.commits import bisect_commits
from harness.results.report import write_report
from pytorch_repo import IDENT, PytorchRepo
from torch_history import FILES, SELECTION, base_files, harmless, isolated_cache, planted

LINEAR = "aten/src/ATen/native/Linear.cpp"
JIT = "torch/csrc/jit/passes/fuse_linear.cpp"
CUH = "aten/src/ATen/native/cuda/Normalization.cuh"
NORMALIZATION = "aten/src/ATen/native/Normalization.cpp"
YAML = "aten/src/ATen/native/native_functions.yaml"
ENTRIES = "- func: linear(Tensor input) -> Tensor\n\n- func: batch_norm_stats(Tensor input) -> (Tensor, Tensor)\n"


def most(n: int) -> int:
    return math.ceil(math.log2(n)) + 3


def interleaved(repo: PytorchRepo) -> list[str]:
    """Off-path C++ commits around a Python defect (5)."""
    return [repo.commit("base", base_files(**{LINEAR: "// linear\n", JIT: "// jit\n"})),
            repo.commit("aten: Linear.cpp", {LINEAR: "// linear 2\n"}),
            repo.commit("nn: comment in batchnorm.py", harmless(FILES[0], 1)),
            repo.commit("jit: fuse_linear", {JIT: "// jit 2\n"}),
            repo.commit("docs", {"README.md": "t\nmore\n"}),
            repo.commit("SyncBatchNorm: count per rank", {FILES[1]: planted()}),
            repo.commit("aten: Linear.cpp again", {LINEAR: "// linear 3\n"}),
            repo.commit("jit: fuse_linear again", {JIT: "// jit 3\n"}),
            repo.commit("test: more", {"test/test_nn.py": "# t\n"}),
            repo.commit("DDP: comment in distributed.py", harmless(FILES[2], 1))]


@pytest.mark.sweep(47)
@pytest.mark.slow
def test_a_python_defect_among_off_path_cpp_commits_is_found_exactly(tmp_path, monkeypatch, kernels):
    isolated_cache(tmp_path, monkeypatch)
    repo = PytorchRepo(tmp_path / "pytorch")
    shas = interleaved(repo)
    store = tmp_path / "store"
    got = bisect_commits(checkout=repo.path, good=shas[0], bad=shas[-1], base=shas[0], selection=SELECTION,
                         store=store)
    text, run = got.summary(), got.run
    assert got.kind == "python" and run.result.outcome is Outcome.FOUND, text
    assert "asked first: the bad end's Python over the good end's binary" in text and " fails: " in text
    assert text.splitlines()[-2:] == [f"first bad commit (Python): {shas[5]}", f"last good commit: {shas[4]}"]
    assert run.stats["evaluated"] <= most(len(shas)), text
    assert not got.untestable
    # Every tested commit after the first C++ change is approximate, and its records say so.
    approx = sorted(got.approximate)
    assert approx and all(i >= 1 for i in approx) and all("none on SyncBN's path" in got.approximate[i]
                                                           for i in approx)
    for i in approx:
        assert all("(approximate: " in r.torch_git_version for r in run.evaluations[i].records)
        assert f"{run.builds[i].label:<40} {run.evaluations[i].verdict.value}~" in text
    # The report lists the bisection's builds in branch order, approximate ones marked.
    index = write_report(store, tmp_path / "report").html.read_text()
    rows = [line for line in index.splitlines() if line.startswith("<tr><th><code>")]
    tested = sorted(i for i, ev in run.evaluations.items() if ev.verdict is not Verdict.SKIP)
    order = [next(n for n, row in enumerate(rows) if shas[i][:12] in row) for i in tested]
    assert order == sorted(order), rows
    assert all(("~" in rows[n]) == (i in got.approximate) for i, n in zip(tested, order))

    # Not asked (the binary's base is after the good end): the same range bisected by relevance.
    got = bisect_commits(checkout=repo.path, good=shas[2], bad=shas[7], base=shas[3], selection=SELECTION)
    text = got.summary()
    assert got.kind == "relevance" and "not asked whether the culprit is Python or compiled" in text
    assert got.run.result.outcome is Outcome.FOUND and not got.untestable, text
    assert text.splitlines()[-2:] == [f"first bad commit (Python): {shas[5]}", f"last good commit: {shas[4]}"]
    assert 0 in got.approximate  # the good end lacks the jit change the binary has: off the path


@pytest.mark.slow(21)
def test_a_compiled_culprit_on_the_path_is_named_with_the_commands_that_build_only_it(tmp_path, monkeypatch,
                                                                                        kernels):
    isolated_cache(tmp_path, monkeypatch)
    repo = PytorchRepo(tmp_path / "pytorch")
    shas = [repo.commit("base", base_files(**{LINEAR: "// l\n", CUH: "// cuh\n", JIT: "// j\n", YAML: ENTRIES})),
            repo.commit("aten: Linear.cpp", {LINEAR: "// l2\n"}),
            repo.commit("nn: comment in batchnorm.py", harmless(FILES[0], 1)),
            repo.commit("cuda: batch_norm_elemt reads the wrong invstd", {CUH: "// cuh: the defect\n"}),
            repo.commit("jit: fuse_linear", {JIT: "// j2\n"}),
            repo.commit("linear: schema", {YAML: ENTRIES.replace("linear(Tensor input)", "linear(Tensor inp)")}),
            repo.commit("test: more", {"test/test_nn.py": "# t\n"})]
    env = {**os.environ, "SYNCBN_HARNESS_CACHE": os.environ["SYNCBN_HARNESS_CACHE"]}
    proc = subprocess.run([sys.executable, "-m", "harness", "bisect", "--overlay", str(repo.path), "--good", shas[0],
                           "--bad", shas[-1], "--base", shas[0], *SELECTION.argv()],
                          capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("asked first: the bad end's Python over the good end's binary")
    assert " passes: the failure comes with compiled changes of the range" in lines[0]
    assert lines[1] == "of the 4 commits in the range that change compiled files, 1 on SyncBN's path:"
    assert lines[2] == f"  {shas[3]}  cuda: batch_norm_elemt reads the wrong invstd  [{CUH}]"
    assert lines[-3] == "(1 builds tested, 0 verdicts from cache, 1 overlays created)"
    assert lines[-2:] == [f"first bad commit (compiled, the only one on SyncBN's path): {shas[3]}",
                          f"last good commit: {shas[0]}"]
    assert 1 <= most(len(shas))
    # The printed git bisect commands build only the suspect: run them with a stand-in for the build step.
    start = next(n for n, line in enumerate(lines) if line.startswith("    cd "))
    end = next(n for n, line in enumerate(lines) if line == "    git bisect run ./bisect-step.py")
    assert lines[start + 1] == f"    git bisect start {shas[-1][:12]} {shas[0][:12]} -- {CUH}"
    command = " && ".join(line.strip() for line in lines[start:end + 1])
    step = tmp_path / "step.sh"
    step.write_text(f"#!/bin/sh\necho built >> {tmp_path}/built\n! grep -q defect {CUH}\n")
    step.chmod(0o755)
    out = subprocess.run(["bash", "-c", command.replace("./bisect-step.py", shlex.quote(str(step)))],
                         capture_output=True, text=True, timeout=120, env={**os.environ, **IDENT})
    assert f"{shas[3]} is the first bad commit" in out.stdout, (out.stdout, out.stderr)
    assert (tmp_path / "built").read_text().count("built") == 1
    # As JSON (the verdict cached): the suspects and the commands, no bisection made up.
    proc = subprocess.run([*proc.args, "--format", "json"], capture_output=True, text=True, timeout=600, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert (got["kind"], got["first_bad_commit"], got["first_bad_candidates"]) == ("compiled", None, [shas[3]])
    assert got["suspects"] == [{"commit": shas[3], "subject": "cuda: batch_norm_elemt reads the wrong invstd",
                                "files": [CUH]}]
    assert got["commands"][-1] == "git bisect run ./bisect-step.py" and got["stats"]["cached"] == 1


@pytest.mark.sweep(29)
@pytest.mark.slow
def test_with_two_binaries_each_commit_lies_over_the_closer_one(tmp_path, monkeypatch, kernels):
    isolated_cache(tmp_path, monkeypatch)
    repo = PytorchRepo(tmp_path / "pytorch")
    shas = [repo.commit("base", base_files(**{NORMALIZATION: "// n\n"})),
            repo.commit("nn: comment in batchnorm.py", harmless(FILES[0], 1)),
            repo.commit("aten: batch_norm_stats", {NORMALIZATION: "// n2\n"}),
            repo.commit("nn: another comment", harmless(FILES[0], 2)),
            repo.commit("SyncBatchNorm: count per rank", {FILES[1]: planted()}),
            repo.commit("DDP: comment in distributed.py", harmless(FILES[2], 1))]
    # One installed torch stands for two nightlies (built from shas[0] and shas[3]): a test cannot install two.
    binaries = [f"{sys.executable}={shas[0]}", f"{sys.executable}={shas[3]}"]
    got = bisect_commits(checkout=repo.path, good=shas[0], bad=shas[-1], binaries=binaries, selection=SELECTION,
                         strict=True)
    text = got.summary()
    assert [got.source.plan(s).target.base for s in shas] == [shas[0]] * 2 + [shas[3]] * 4
    assert got.run.result.outcome is Outcome.FOUND and not got.untestable, text
    assert text.splitlines()[-2:] == [f"first bad commit (Python): {shas[4]}", f"last good commit: {shas[3]}"]
    assert got.run.stats["evaluated"] <= most(len(shas))
    records = got.run.evaluations[4].records
    assert {r.torch_git_version for r in records} == {f"overlay of {shas[4]} on {torch.version.git_version}"}
