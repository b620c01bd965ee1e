"""The package installs the way users install it: a wheel (``pip install .``), not only an editable checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                           str(out), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [whl] = out.glob("syncbn_harness-*.whl")
    return whl


def expected_files() -> set[str]:
    """Every module and data file of the checkout, by its path inside an installed ``harness`` package."""
    files = {str(p.relative_to(ROOT)) for p in (ROOT / "harness").rglob("*.py")}
    for folder, exts in (("cases", ("*.py", "*.toml")), ("kernels", ("*.py", "*.cpp", "*.h", "*.cu", "*.cuh"))):
        for ext in exts:
            files |= {f"harness/{folder}/{p.relative_to(ROOT / folder)}" for p in (ROOT / folder).rglob(ext)}
    return {f for f in files if "__pycache__" not in f}


def test_the_wheel_holds_every_module_and_data_file(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    missing = sorted(expected_files() - names)
    assert not missing, f"the wheel lacks {missing}: `pip install .` would break"
    assert any(n.endswith("entry_points.txt") for n in names)


@pytest.mark.sweep(59)
@pytest.mark.slow
def test_a_non_editable_install_runs_from_outside_the_checkout(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    import torch

    # --no-compile: no bytecode written for all of torch (half the install's time); what is imported compiles then.
    install = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-compile",
                              f"torch=={torch.__version__.split('+')[0]}", str(wheel)],
                             capture_output=True, text=True, timeout=1800)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    away = tmp_path / "elsewhere"
    away.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["SYNCBN_HARNESS_CACHE"] = str(tmp_path / "cache")
    proc = subprocess.run([str(venv / "bin" / "syncbn-harness"), "run", "--impl", "reference", "--case", "numerics/*",
                           "--device", "cpu"], cwd=away, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    n = len([c for c in __import__("harness.catalog", fromlist=["select"]).select(["numerics/*"])])
    assert f"{n} records: {n} pass" in proc.stdout
    where = subprocess.run([str(py), "-c", "import harness; print(harness.__file__)"], cwd=away, env=env,
                           capture_output=True, text=True, timeout=120)
    assert str(venv) in where.stdout and str(ROOT) not in where.stdout  # the installed copy ran, not the checkout
