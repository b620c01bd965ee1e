"""cpu-emulation against CUDA, case by case, and only within one torch build.

Design: the CPU side is real (a `run` on CPU of torch in cpu-emulation and of the reference, into a store). The
CUDA side cannot exist here: it is the same records with ``device`` set to ``cuda`` (a stand-in for a GPU run,
said so), one of them with a different status, written through the real store.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from cli_here import run_here

from harness.results.fidelity import build_mismatch, compare
from harness.judge.status import Status
from harness.results.records import Record
from harness.results.store import Store

CASES = ("numerics/offset-1e3/ws2", "allgather-shape/uneven-2-6/float32-float32/contiguous/ws2")


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    store = tmp_path_factory.mktemp("emulated")
    proc = run_here(["run", "--device", "cpu", "--impl", "torch", "--impl", "reference",
                     *(a for c in CASES for a in ("--case", c)), "--store", str(store)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    return store


def as_cuda(records, **changes) -> list[Record]:
    """The records as a CUDA run of the same build would store them (the GPU stand-in), with ``changes``."""
    out = []
    for r in records:
        d = {**r.to_dict(), "device": "cuda", "mode": "native", **changes}
        out.append(Record.from_dict(d))
    return out


def write(store_dir, records):
    store = Store(store_dir)
    for r in records:
        store.append(r)
    return store_dir


def test_the_same_build_compares_case_by_case(emulated, tmp_path):
    records = Store(emulated).read()
    cuda = as_cuda(records)
    flipped = next(r for r in cuda if r.impl == "torch" and r.case == CASES[0])
    flipped.status, flipped.message = Status.ERROR, "RuntimeError: only on CUDA"
    fid = compare(records, cuda, "torch")
    assert fid.agreed == len(CASES) - 1 and [d.case for d in fid.disagreements] == [CASES[0]]
    assert fid.disagreements[0].native == "error" and build_mismatch(records, cuda, "torch") == ""
    native = write(tmp_path / "native", cuda)
    proc = run_here(["fidelity", "--emulated", emulated, "--native", native, "--impl", "torch"])
    assert proc.returncode == 0, proc.stderr
    assert f"torch: {len(CASES)} cases compared, {len(CASES) - 1} agree, 1 disagree" in proc.stdout


def test_stores_of_different_torch_builds_are_refused(emulated, tmp_path):
    records = Store(emulated).read()
    cuda = as_cuda(records, torch_version="2.11.0+cu130", torch_git_version="70d99e998b49" + "0" * 28)
    assert "from torch 2.11.0 (git 70d99e998b49)" in build_mismatch(records, cuda, "torch")
    native = write(tmp_path / "native", cuda)
    proc = run_here(["fidelity", "--emulated", emulated, "--native", native, "--impl", "reference"])
    assert proc.returncode == 2 and "hold different torch builds" in proc.stderr, proc.stderr
    assert "on the GPU machine itself" in proc.stderr
    # A local suffix alone (the same release and commit built for another CUDA) is the same Python: compared.
    same = as_cuda(records, torch_version=records[0].torch_version.split("+")[0] + "+cu130")
    assert build_mismatch(records, same, "torch") == ""


def test_structural_problems_are_told_apart_by_their_kind_not_their_words(emulated):
    """The same kind in other words agrees; a kind on one side only disagrees; words alone are no kind."""
    from harness.judge.metric import Metric, Problem

    records = [r for r in Store(emulated).read() if r.impl == "torch"]

    def with_metric(side, problem, kind):  # in memory: a stored metric without a kind gets its old reading
        return [replace(r, status=Status.MISMATCH, metrics={"rank0.step0.train.output": Metric.failure(problem, kind)})
                for r in side]

    cpu = with_metric(records, "dtype torch.float32, expected torch.float16", Problem.DTYPE)
    same_kind = with_metric(as_cuda(records), "came back as float32 where float16 was asked", Problem.DTYPE)
    assert not compare(cpu, same_kind, "torch").disagreements
    layout = with_metric(as_cuda(records), "came back as float32 where float16 was asked", Problem.LAYOUT)
    fid = compare(cpu, layout, "torch")
    assert len(fid.disagreements) == len(CASES)
    assert fid.disagreements[0].emulated == "mismatch (dtype torch.float32, expected torch.float16)"
    worded = with_metric(records, "a dtype, a layout, a shape and a stride named in prose", None)
    plain = with_metric(as_cuda(records), "num_batches_tracked 2, expected 3", None)
    assert not compare(worded, plain, "torch").disagreements
