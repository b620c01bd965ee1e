"""The compile family: compiled runs judged against eager and the oracle, what dynamo did recorded and diffed.

Everything runs through the real engine (rank processes over gloo, real
dynamo). Planted defects (tests/support/compiled_defects.py) change only the
compiled graphs: one by far less than the oracle's tolerance (only the bitwise
comparison with eager sees it), one by a tenth. The torch emulation must stay
invisible to dynamo: no graph break, eager frame or recompile of a compiled
torch case may come from the harness's own code.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from harness import catalog
from harness.engine.session import RunOptions, resolve_impls, run_selection
from harness.results import compile_stats, gate
from harness.results.diff import ChangeKind, changes
from harness.judge.status import Status

SUPPORT = str(Path(__file__).resolve().parents[1] / "support")
LAYER_EAGER = "compile/layer/eager/breaks-allowed/auto-dynamic/ws2"
DDP_EAGER = "compile/ddp-cnn/eager/breaks-allowed/auto-dynamic/ws2"

pytestmark = [pytest.mark.usefixtures("support_on_path"),
              pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile needs torch >= 2.0")]



def _run(case_ids, impl):
    return list(run_selection(catalog.select(case_ids), resolve_impls([impl]), RunOptions(timeout=120,
                                                                                       diagnose=False)))


def test_the_family_is_listed_with_inductor_once_in_the_default_selection():
    default = [c for c in catalog.select(["compile/*"])]
    everything = catalog.select(["compile/*"], exhaustive=True)
    assert len(everything) == 5 * 3 * 2 * 2
    assert [c.compile[0] for c in default].count("inductor") == 1
    assert {c.compile[0] for c in default} == {"eager", "aot_eager", "inductor"}
    assert {"fullgraph" in c.compile for c in default} == {True, False}


def test_reference_and_torch_compiled_agree_with_eager_and_the_oracle_and_say_what_dynamo_did():
    records = _run([LAYER_EAGER, DDP_EAGER], "reference") + _run([LAYER_EAGER], "torch")
    for r in records:
        assert r.status is Status.PASS, (r.impl, r.case, r.message)
        assert r.compile["backend"] == "eager" and sorted(r.compile["ranks"]) == ["0", "1"], r.compile
        for stats in r.compile["ranks"].values():
            assert stats["vs_eager"]["bitwise"], (r.impl, r.case, stats["vs_eager"])
            assert stats["vs_eager"]["compared"] > 0
            said = [b["reason"] + " " + b.get("where", "") for b in stats["graph_breaks"]]
            said += [b["reason"] for b in stats["skipped_frames"] + stats["recompiles"]]
            # The harness's own instrumentation (collective recorder, emulated kernels) is invisible to dynamo.
            assert not [s for s in said if "collectives.py" in s or "torch_emulation" in s], said
    reference = {r.case: r for r in records if r.impl == "reference"}
    stats = reference[LAYER_EAGER].compile["ranks"]["0"]
    # The reference reads no count on the host where a rank has 2 or more values of its own (welford_finish
    # finishes the merge on the device): no graph break at a host read.
    assert stats["graphs"] >= 1 and not any("item()" in b["reason"] and "reference.py" in b.get("where", "")
                                            for b in stats["graph_breaks"]), stats
    # The batch changes between steps: dynamo recompiles for the new size.
    assert any("size mismatch" in x["reason"] for x in stats["recompiles"]), stats["recompiles"]
    torch_stats = next(r for r in records if r.impl == "torch").compile["ranks"]["0"]
    assert torch_stats["graph_breaks"] or torch_stats["skipped_frames"], torch_stats
    assert "torch.compile" in "\n".join(["torch.compile"] + compile_stats.summary(reference[LAYER_EAGER]))


def test_a_fullgraph_case_is_unsupported_for_the_reference_and_a_known_error_for_torch():
    case = "compile/layer/aot_eager/fullgraph/dynamic/ws2"
    [ref] = _run([case], "reference")
    assert ref.status is Status.UNSUPPORTED and "fullgraph" in ref.message, ref.message
    [tor] = _run([case], "torch")
    assert tor.status is Status.ERROR and tor.known, (tor.status, tor.message)
    assert "fake tensors" in tor.message, tor.message


def test_a_difference_only_in_the_compiled_graph_is_caught_by_the_bitwise_comparison_with_eager():
    [r] = _run([LAYER_EAGER], "compiled_defects:NudgedWhenCompiled")
    assert r.status is Status.MISMATCH, (r.status, r.message)
    assert "backend eager differs from eager" in r.message and "output" in r.message, r.message
    assert not any(not m.ok for name, m in r.metrics.items() if "vs_eager" not in name), \
        "the nudge is inside the oracle's tolerance: only the comparison with eager may fail"


def test_a_wrong_compiled_graph_is_caught_by_the_oracle_on_a_backend_that_may_reorder():
    [r] = _run(["compile/layer-float16/aot_eager/breaks-allowed/dynamic/ws2"], "compiled_defects:ShiftedWhenCompiled")
    assert r.status is Status.MISMATCH, (r.status, r.message)
    assert "output" in r.message and "vs_eager" not in r.message, r.message
    assert not r.compile["ranks"]["0"]["vs_eager"]["bitwise"]


def _with_breaks(record, rank_breaks):
    ranks = {rank: dict(stats, graph_breaks=[{"reason": b, "where": "x.py:1 in f", "count": 1} for b in rank_breaks])
             for rank, stats in record.compile["ranks"].items()}
    return dataclasses.replace(record, compile=dict(record.compile, ranks=ranks))


def test_a_new_graph_break_is_a_change_diff_reports_and_gate_fails_on_when_asked():
    [base] = _run([LAYER_EAGER], "reference")
    now = _with_breaks(base, ["Unsupported Tensor.item() call", "a new break"])
    before = _with_breaks(base, ["Unsupported Tensor.item() call"])
    [change] = changes([before], [now])
    assert change.kind is ChangeKind.COMPILATION and not change.regression
    assert "new break: a new break" in change.describe(), change.describe()
    assert gate.evaluate([before], [now]).exit_code == 0
    failing = gate.evaluate([before], [now], fail_on_compilation=True)
    assert failing.exit_code == 1 and "COMPILATION CHANGED" in gate.format_result(failing, "baseline.json")
    [same] = changes([before], [before])
    assert same.kind is ChangeKind.SAME


def test_the_emulated_module_accepts_cpu_without_answering_cpu_to_anyone_else():
    """In a fresh process: torch's forward, recompiled with its privateuse1 lookup answered in the source only."""
    code = textwrap.dedent("""
        import inspect, torch
        from harness.impls import torch_emulation
        if torch_emulation.device_check_path() != "module":
            print("SKIP"); raise SystemExit
        original = torch.nn.SyncBatchNorm.forward
        torch_emulation.accept_cpu_in_module()
        forward = torch.nn.SyncBatchNorm.forward
        assert forward is not original and forward._syncbn_harness_accepts_cpu
        assert forward.__code__.co_filename == original.__code__.co_filename
        assert forward.__code__.co_firstlineno == original.__code__.co_firstlineno
        assert torch._C._get_privateuse1_backend_name() == "privateuseone"
        from torch._subclasses.fake_tensor import FakeTensorMode
        with FakeTensorMode():
            t = torch.empty(2, 3)
        assert t.device == torch.device("cpu"), t.device
        torch_emulation.accept_cpu_in_module()  # a second call changes nothing
        assert torch.nn.SyncBatchNorm.forward is forward
        print("OK")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    if proc.stdout.strip() == "SKIP":
        pytest.skip(f"torch {torch.__version__}'s module reads input.is_cuda: the function path is used")
    assert proc.returncode == 0 and proc.stdout.strip() == "OK", proc.stdout + proc.stderr
