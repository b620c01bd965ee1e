"""``bisect-script``: a real ``git bisect run`` over a real repository lands on the planted commit.

The repository (made in tmp_path) holds ``bisectplug.py``, a SyncBatchNorm in
plain torch over ``torch.distributed.nn.functional.all_reduce`` (the same
source as test_bisect's package). Its history: correct, correct, a syntax
error (the build step fails: skip), an import error (``check`` exits 125:
skip), correct, then a biased running variance from commit ``k`` on.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.bisect.script import write_script
from harness.selection import Selection

CASE = "allgather-shape/uneven-2-6/float64-float64/contiguous/ws2"


from syncbnplug_template import PLUGIN  # noqa: E402


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@e"}
    out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, (args, out.stdout, out.stderr)
    return out.stdout.strip()


def plugin_source(biased: bool, broken: str = "") -> str:
    return PLUGIN.format(version="0", biased=biased, broken=broken)


HISTORY = [
    ("correct", plugin_source(False)),
    ("comment", plugin_source(False) + "\n# tidy\n"),
    ("syntax error", plugin_source(False) + "\ndef broken(:\n"),
    ("import error", plugin_source(False, broken="import bisectplug_missing_dependency")),
    ("fix import", plugin_source(False) + "\n# fixed\n"),
    ("biased running variance", plugin_source(True)),  # commit k
    ("comment", plugin_source(True) + "\n# later\n"),
    ("comment", plugin_source(True) + "\n# later still\n"),
]
K = 5


@pytest.fixture
def repo(tmp_path) -> tuple[Path, list[str]]:
    repo = tmp_path / "plugin-repo"
    repo.mkdir()
    git(repo, "init", "-q")
    commits = []
    for msg, src in HISTORY:
        (repo / "bisectplug.py").write_text(src)
        git(repo, "add", "bisectplug.py")
        git(repo, "commit", "-q", "-m", msg)
        commits.append(git(repo, "rev-parse", "HEAD"))
    return repo, commits


@pytest.mark.slow(25)
def test_git_bisect_run_lands_on_the_planted_commit(repo, tmp_path):
    repo, commits = repo
    script = write_script(str(tmp_path / "step.py"), Selection(impls=("bisectplug:SyncBatchNorm",),
                                                                   case_patterns=(CASE,), device="cpu", timeout=60),
                          build_cmd="python -m py_compile bisectplug.py", checkout_on_path=True)
    git(repo, "bisect", "start", commits[-1], commits[0])
    out = git(repo, "bisect", "run", str(script))
    assert f"{commits[K]} is the first bad commit" in out, out
    assert "biased running variance" in out
    log = Path(str(script) + ".log").read_text()
    # Every line says when, which commit, which step, the exit code and the time.
    assert all(re.match(r"\S+ commit=\w+ step=\w+ exit=\S+ time=[\d.]+s cmd=", ln) for ln in log.splitlines())
    # The syntax-error commit's build failed (skip) if git tested it; the import-error commit is untestable.
    steps = {}
    for ln in log.splitlines():
        m = re.search(r"commit=(\w+) step=(\w+) exit=(\S+)", ln)
        steps.setdefault(m.group(1), {})[m.group(2)] = m.group(3)
    tested = {c: s for c, s in steps.items()}
    by_short = {c[:12]: i for i, c in enumerate(commits)}
    for short, s in tested.items():
        i = by_short[short]
        want = "125" if i in (2, 3) else ("1" if i >= K else "0")
        assert s["verdict"] == want, (i, s)
        if i == 2:
            assert s["build"] != "0" and "check" not in s
    assert any(by_short[c] in (2, 3) for c in tested), "no untestable commit was met; the history lost its point"


def test_failed_build_and_killed_check_mean_skip(tmp_path):
    """A failing build exits 125 without running check; a check killed by a signal exits 125, not 128+."""
    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "killer.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    git(repo, "add", "killer.py")
    git(repo, "commit", "-q", "-m", "a module that kills whoever imports it")
    failing = write_script(str(tmp_path / "fail.py"), Selection(impls=("reference",), case_patterns=(CASE,)),
                           build_cmd="echo building; exit 3")
    proc = subprocess.run([str(failing)], cwd=repo, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 125, proc.stderr
    log = Path(str(failing) + ".log").read_text()
    assert "step=build exit=3" in log and "step=check" not in log

    killed = write_script(str(tmp_path / "kill.py"),
                          Selection(impls=("killer:Nothing",), case_patterns=(CASE,), device="cpu"),
                          checkout_on_path=True)
    proc = subprocess.run([str(killed)], cwd=repo, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 125, proc.stderr
    log = Path(str(killed) + ".log").read_text()
    # check runs the cases in a worker process: the kill is the worker's, and check says 125 itself
    assert "step=check exit=125" in log and "step=verdict exit=125" in log
    assert "running the cases killed the check's worker process (SIGKILL)" in proc.stderr + log


def test_bisect_script_command_writes_an_executable_script(tmp_path):
    out = tmp_path / "s.py"
    proc = subprocess.run([sys.executable, "-m", "harness", "bisect-script", "--impl", "reference", "--case", CASE,
                           "--build-cmd", "pip install -e .", "-o", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert text.startswith(f"#!{sys.executable}\n") and os.access(out, os.X_OK)
    assert "BUILD_CMD = 'pip install -e .'" in text and repr(["--impl", "reference", "--case", CASE]) in text
    proc = subprocess.run([sys.executable, "-m", "harness", "bisect-script", "--case", "nope/*", "-o", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "matches no case" in proc.stderr
