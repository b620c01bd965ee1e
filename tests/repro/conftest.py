"""Writing a repro file in the test's own process.

A test whose property is the file (what it checks, that it stands alone) rather than the ``repro`` command
writes it with :func:`harness.repro.write_repro`, the function the command calls: the case runs on the
test process's forkserver, which already has torch, where a CLI subprocess would import it twice more (its
own process and its forkserver). The command's own behaviour keeps tests that run it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture
def write_here(monkeypatch):
    """``write_here(case, impl, out, pythonpath, long=False)``: the repro file of ``case`` for ``impl`` at
    ``out`` (the short one not run once), with ``pythonpath`` (plugins) on this process's path and the
    ranks'; returns what :func:`~harness.repro.write_repro` returns."""
    from harness.repro import write_repro

    def write(case: str, impl: str, out: Path, pythonpath: str, *, long: bool = False):
        monkeypatch.setenv("PYTHONPATH", pythonpath)  # the ranks' sys.path, as the CLI's would have it
        for folder in reversed(pythonpath.split(os.pathsep)):
            monkeypatch.syspath_prepend(folder)
        form = " --long" if long else ""
        return write_repro(case, impl, output=str(out), command=f"syncbn-harness repro {case} --impl {impl}{form}",
                           long=long, verify=False)

    return write
