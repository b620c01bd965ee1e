"""Repro files judged by the line they print: a crash of the file itself never reads as "the symptom shows".

Design: real files run as real processes (their own process groups), among them the repository's own
docs/findings files, which on a machine without a GPU say so (exit 2) or need a library this machine lacks.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from harness.gpu_suite import repros
from harness.gpu_suite.repros import ABSENT, BROKEN, CANNOT, NOT_RUN, SHOWS, judge

ROOT = Path(__file__).resolve().parents[2]


def test_the_verdict_needs_the_line_and_the_exit_status_together():
    assert judge(1, "rank 0 ...\nSYMPTOM SHOWS (mismatch): output off\n") == (SHOWS, "SYMPTOM SHOWS (mismatch): "
                                                                                  "output off")
    assert judge(0, "no symptom (pass): every rank agrees\n")[0] == ABSENT
    assert judge(2, "OTHER: needs a GPU\n")[0] == CANNOT
    # An uncaught exception exits 1 too: without the line it is the file that failed, not a symptom.
    verdict, why = judge(1, "Traceback (most recent call last):\nImportError: No module named apex\n")
    assert verdict == BROKEN and "ImportError" in why
    assert judge(0, "SYMPTOM SHOWS (x): y\n")[0] == BROKEN  # the line and the status disagree
    assert judge(None, "SYMPTOM SHOWS")[0] == BROKEN and judge(-11, "")[1] == "killed by SIGSEGV"


def write(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(body)
    return path


def test_files_run_side_by_side_each_judged(tmp_path):
    files = [write(tmp_path, "shows.py", "import sys\nprint('SYMPTOM SHOWS (mismatch): off by 1')\nsys.exit(1)\n"),
             write(tmp_path, "raises.py", "raise RuntimeError('the file itself is wrong')\n"),
             write(tmp_path, "needs_lib.py", "import sys\nimport not_a_library_here\nfrom os import path\n"),
             write(tmp_path, "slow.py", "import time\ntime.sleep(60)\n"),
             write(tmp_path, "fine.py", "print('no symptom (pass): agrees')\n")]
    t0 = time.monotonic()
    got = repros.run_all(files, tmp_path / "logs", dict(os.environ), parallel=5, timeout_s=3)
    assert time.monotonic() - t0 < 20
    assert [(v.file, v.verdict) for v in got] == [("shows.py", SHOWS), ("raises.py", BROKEN),
                                                  ("needs_lib.py", NOT_RUN), ("slow.py", BROKEN),
                                                  ("fine.py", ABSENT)]
    by = {v.file: v for v in got}
    assert by["needs_lib.py"].line == "needs not_a_library_here, not installed here"
    assert "RuntimeError" in by["raises.py"].line and by["slow.py"].line == "stopped at its time limit"
    assert "the file itself is wrong" in (tmp_path / "logs" / "raises.txt").read_text()


def test_the_command_gives_apex_files_their_path_and_fails_only_on_a_broken_file(tmp_path):
    """--apex-path reaches the file's imports; the findings' own files on this machine say what they can."""
    lib = tmp_path / "lib" / "fakeapex"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text("")
    uses = write(tmp_path, "uses_apex.py", "import sys\nimport fakeapex\nprint('SYMPTOM SHOWS (x): y')\n"
                                           "sys.exit(1)\n")
    findings = [ROOT / "docs" / "findings" / "torch_half_count_overflow.py",
                ROOT / "docs" / "findings" / "fairscale_momentum_none.py"]
    out = tmp_path / "repros.json"
    code = repros.main(["--out", str(out), "--logs", str(tmp_path / "logs"), "--apex-path", str(tmp_path / "lib"),
                        str(uses), *map(str, findings)])
    verdicts = {v["file"]: v for v in json.loads(out.read_text())}
    assert verdicts["uses_apex.py"]["verdict"] == SHOWS
    import torch

    if not torch.cuda.is_available():
        assert verdicts["torch_half_count_overflow.py"]["verdict"] == CANNOT
        assert "needs a GPU" in verdicts["torch_half_count_overflow.py"]["line"]
    try:
        import fairscale  # noqa: F401
    except ImportError:
        assert verdicts["fairscale_momentum_none.py"] == {**verdicts["fairscale_momentum_none.py"],
                                                          "verdict": NOT_RUN,
                                                          "line": "needs fairscale, not installed here"}
    assert code == 0
    broken = write(tmp_path, "broken.py", "import sys\nsys.exit(1)\n")
    assert repros.main(["--out", str(out), "--logs", str(tmp_path / "logs"), str(broken)]) == 1


def test_verdicts_are_kept_as_each_file_ends_and_sigterm_leaves_no_file_running(tmp_path):
    """A repro step stopped at its limit keeps the verdicts of the files that ended (2026-11-28: none was kept),
    and its files' processes, each in a session of its own, go with it."""
    import signal
    import subprocess
    import sys

    pid = tmp_path / "pid"
    quick = write(tmp_path, "quick.py", "print('no symptom (pass): agrees')\n")
    slow = write(tmp_path, "slow.py", f"import os, time\nopen({str(pid)!r}, 'w').write(str(os.getpid()))\n"
                                      "time.sleep(60)\n")
    out = tmp_path / "repros.json"
    proc = subprocess.Popen([sys.executable, "-m", "harness.gpu_suite.repros", "--out", str(out), "--logs",
                             str(tmp_path / "logs"), "--parallel", "2", str(quick), str(slow)])
    try:
        for _ in range(100):
            if out.exists() and out.read_text().strip():
                break
            time.sleep(0.1)
        assert [v["file"] for v in json.loads(out.read_text())] == ["quick.py"]
        for _ in range(100):
            if pid.exists() and pid.read_text():
                break
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 130
    finally:
        proc.kill()
        proc.wait()
    slow_pid = int(pid.read_text())
    for _ in range(50):
        try:
            os.kill(slow_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the slow file outlived the repro step")
