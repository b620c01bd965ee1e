"""How ranks start and what they share: the forkserver's preload table, the CPU share, the kept case data."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from harness import catalog
from harness.engine import forkserver
from harness.engine.rank import share_cores
from harness.engine.session import RunOptions, resolve_impls, run_selection
from harness.scenarios import prepared

SUPPORT = str(Path(__file__).resolve().parents[1] / "support")


def test_light_families_are_exactly_the_families_whose_ranks_never_import_dynamo():
    needing: dict[str, bool] = {}
    for case in catalog.select([], exhaustive=True):
        needing[case.family] = needing.get(case.family, False) or forkserver.case_needs_dynamo(case)
    light = sorted(f for f, needs in needing.items() if not needs and f != "search-found")
    assert sorted(forkserver.LIGHT_FAMILIES) == light, (
        "forkserver.LIGHT_FAMILIES is out of date with the catalog: a light family listed there would start its "
        "ranks without dynamo (slow), a missing one with it (slow start)")


@pytest.mark.parametrize("patterns,needed", [
    ((), True),  # the default selection has ddp and compile cases
    (("module-config/*",), False),
    (("module-config/affine-off/ws2", "scale/*"), False),
    (("ddp/*",), True),
    (("*/ws2",), True),  # a wildcard family could be any family
    (("module-config/*", "compile/*"), True),
])
def test_needs_dynamo_reads_the_family_part_of_each_pattern(patterns, needed):
    assert forkserver.needs_dynamo(patterns) is needed


def test_ranks_share_the_cpus_unless_the_user_set_omp_num_threads(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        cpus = len(os.sched_getaffinity(0))
        assert share_cores(2) == max(1, cpus // 2) == torch.get_num_threads()
        assert share_cores(64) == 1
        torch.set_num_threads(3)
        monkeypatch.setenv("OMP_NUM_THREADS", "3")
        assert share_cores(2) == 3
    finally:
        torch.set_num_threads(before)


def test_a_case_prepared_twice_is_computed_once_and_another_case_replaces_it():
    a, b = catalog.select(["numerics/offset-1e3/ws2"])[0], catalog.select(["module-config/affine-off/ws2"])[0]
    prepared.forget()
    hits = prepared.hits
    data, truths = prepared.prepare(a, 0)
    again = prepared.prepare(a, 0)
    assert again[0] is data and again[1] is truths and prepared.hits == hits + 1
    other_rank = prepared.prepare(a, 1)
    assert other_rank[0] is not data and prepared.hits == hits + 1  # another rank's truths differ
    prepared.prepare(b, 0)
    assert prepared.prepare(a, 0)[0] is not data  # only one case is kept
    prepared.forget()


@pytest.mark.slow
def test_an_implementation_that_changes_its_inputs_cannot_change_the_next_ones_verdict(monkeypatch):
    """The ranks keep a case's tensors for the next implementation: one that writes into its input or its
    upstream gradient must not reach them (the reference after it gets the same record as alone)."""
    monkeypatch.setenv("PYTHONPATH", SUPPORT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cases = catalog.select(["allgather-shape/uneven-2-6/float32-float32/contiguous/ws2"])
    opts = RunOptions(device="cpu", timeout=120)
    after = list(run_selection(cases, resolve_impls(["defects:NormalizesInPlace", "probes:ZeroesGradOutputInPlace",
                                                     "reference"]), opts))
    alone = list(run_selection(cases, resolve_impls(["reference"]), opts))
    by_impl = {r.impl: r for r in after}
    assert by_impl["defects:NormalizesInPlace"].status.value == "mismatch"  # its own input problem, found
    ref_after, ref_alone = by_impl["reference"], alone[0]
    assert ref_after.status == ref_alone.status and ref_alone.status.value == "pass", ref_after.message
    assert {k: m.to_dict() for k, m in ref_after.metrics.items()} == \
        {k: m.to_dict() for k, m in ref_alone.metrics.items()}


def test_the_forkserver_leaves_without_teardown_and_its_forks_keep_theirs(tmp_path):
    """The preload's last module makes the process that imported it (the forkserver) skip every exit handler
    registered before it; a process forked from it (a rank) is another pid and exits as usual."""
    import subprocess
    import sys

    script = tmp_path / "server.py"
    script.write_text(
        "import atexit, os, sys\n"
        "atexit.register(lambda: print(f'teardown {os.getpid()}', flush=True))\n"
        "import harness.engine.warm_server\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    sys.exit(0)\n"
        "os.waitpid(child, 0)\n"
        "print(f'server {os.getpid()}', flush=True)\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split()
    server = lines[lines.index("server") + 1]
    assert f"teardown {server}" not in proc.stdout  # the server left at once
    assert proc.stdout.count("teardown") == 1  # the fork ran its handlers
    # The helpers alone change nothing at exit (a test runner's worker imports them and must clean up after).
    script.write_text("import atexit\natexit.register(lambda: print('teardown', flush=True))\n"
                      "import harness.engine.warm\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.split() == ["teardown"], proc.stdout + proc.stderr


def test_a_tmpdir_too_deep_for_the_forkservers_socket_falls_back_to_spawn(tmp_path, monkeypatch, capsys):
    import tempfile

    from harness.engine import forkserver
    from harness.errors import HarnessError

    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    monkeypatch.setattr(forkserver, "_said_spawn", False)
    monkeypatch.delenv("SYNCBN_HARNESS_START_METHOD", raising=False)
    assert not forkserver.socket_path_fits()
    assert forkserver.method() == "spawn" and forkserver.method() == "spawn"
    assert capsys.readouterr().err.count("TMPDIR is too long for the forkserver's socket") == 1  # said once
    monkeypatch.setenv("SYNCBN_HARNESS_START_METHOD", "forkserver")
    with pytest.raises(HarnessError, match="set TMPDIR to a shorter folder"):
        forkserver.method()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert forkserver.socket_path_fits() == (len(str(tmp_path)) + 32 <= 107)


PRELOAD_PROBE = """
import glob, sys, torch
from harness.engine import warm
warm.dynamo()
reachable = any(glob.glob(p) for p in warm.GPU_DEVICE_FILES)
print(torch.version.cuda, warm.preload_is_safe(), reachable, 'torch._dynamo' in sys.modules,
      torch.cuda.is_initialized())
"""


def test_the_forkserver_preloads_wherever_no_gpu_can_be_reached_and_never_initializes_cuda(request):
    """On a CPU build always; on a CUDA build (CI lends the CUDA compile check's torch) only where this machine
    has no GPU device file, and then without initializing CUDA (the forked ranks could not use it)."""
    from harness.engine import warm

    assert torch.version.cuda is not None or warm.preload_is_safe()
    python = request.getfixturevalue("cuda_torch_python")  # after the CPU-build check, which runs everywhere
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([python, "-c", PRELOAD_PROBE], cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    cuda, safe, reachable, dynamo_loaded, initialized = proc.stdout.split()
    assert cuda != "None", "the lent Python's torch is not a CUDA build"
    assert safe == str(reachable == "False") and dynamo_loaded == safe
    assert initialized == "False"
