"""The lent GPU machine rehearsed on CPU: `.ci/gpu-suite.sh` offline, over a CUDA build of torch, without a GPU.

Design: what differs on a lent machine is that it reaches no package index, holds only a CUDA torch and the
packages listed in docs/gpu-suite.md, and returns at most 8 files two folders deep from a command of at most
2,000 characters over a working tree of at most 64 MiB. So the wrapper runs in a network namespace with only
loopback (``unshare -rn``), in a Python whose torch is a CUDA build (``$SYNCBN_HARNESS_CUDA_TORCH_PYTHON``;
`.ci/run` points it at the CUDA-compile check's venv), from this checkout: it installs the checkout offline,
runs the suite, which finds no GPU and fails (exit 3) with the reason, and packs what it has. A failed or
stopped step leaving every file is checked with real steps in test_pack.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"^[A-Za-z0-9._-]+$")
MIB = 2**20


def offline_prefix() -> list[str]:
    """Run in a network namespace with loopback only (gloo needs it), where this machine allows one."""
    if shutil.which("unshare") and subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode == 0:
        return ["unshare", "-rn", "sh", "-c", 'ip link set lo up 2>/dev/null; exec "$@"', "offline"]
    return []


def device_command() -> str:
    """The lent machine's command as docs/gpu-suite.md gives it (the block after its marker)."""
    text = (ROOT / "docs" / "gpu-suite.md").read_text()
    return text.split("<!-- device command -->", 1)[1].split("```", 2)[1].split("\n", 1)[1].strip()


def tree_bytes() -> int:
    """What a call to the lent machine sends: tracked and untracked-but-not-ignored files."""
    names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.split(b"\0")
    return sum((ROOT / n.decode()).stat().st_size for n in names if n and (ROOT / n.decode()).is_file())


def test_the_device_command_and_what_travels_fit_the_lent_machine():
    cmd = device_command()
    assert re.match(r"^(SYNCBN_HARNESS_\w+=\S+( \S+)*? )*bash \.ci/gpu-suite\.sh \$OUT ", cmd), cmd
    assert len(cmd.replace("<git rev-parse HEAD>", "0" * 40)) <= 2000, cmd
    carried = sum(p.stat().st_size for p in (ROOT / ".gpu-carry").rglob("*") if p.is_file()) \
        if (ROOT / ".gpu-carry").is_dir() else 0
    assert tree_bytes() <= 40 * MIB  # leaves 24 MiB of the 64 for .gpu-carry (an apex checkout is 5 MiB)
    assert tree_bytes() + carried <= 64 * MIB


@pytest.mark.slow(24)
def test_the_wrapper_runs_offline_and_packs_what_it_has(tmp_path, cuda_torch_python):
    py = cuda_torch_python
    probe = subprocess.run([py, "-c", "import torch; print(torch.version.cuda, torch.cuda.is_available())"],
                           capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0 and probe.stdout.split()[0] != "None", probe.stdout + probe.stderr
    if probe.stdout.split()[1] == "True":
        pytest.skip("this machine has a GPU: the suite would really run; see docs/gpu-suite.md")
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHON=py, SYNCBN_HARNESS_GPU_BUDGET_S="120", PATH="/usr/bin:/bin",
               SYNCBN_HARNESS_CACHE=str(tmp_path / "cache"))
    proc = subprocess.run([*offline_prefix(), "bash", str(ROOT / ".ci" / "gpu-suite.sh"), str(out),
                           "--repro", "docs/findings/torch_half_count_overflow.py"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 3, text
    assert "installed offline" in text and "sees no GPU" in text, text
    assert f"python {Path(py).absolute()}" in text or "python /" in text
    files = [p for p in out.rglob("*") if p.is_file()]
    assert 4 <= len(files) <= 8 and all(len(p.relative_to(out).parts) <= 3 for p in files), files
    assert all(NAME.match(p.name) for p in files)
    assert {"console.txt", "steps.json", "summary.md", "machine.json", "suite.tar.gz"} <= {p.name for p in files}
    console = (out / "console.txt").read_text()
    assert "installed offline" in console and "cannot run here" in console
