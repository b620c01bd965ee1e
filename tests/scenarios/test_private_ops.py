"""The private-ops family: each op's arguments and judgement, the family in rank processes, and `diff` naming an op.

In this process (no ranks): every case's arguments on every rank go to the reference's kernels of the five ops,
which must pass everything, and to CUDA's arithmetic as the cpu-emulation runs it (harness/impls/cuda_arith.py,
called directly: registering it as torch's CPU kernels is for rank processes only), which must fail exactly the
three adversarial cases of torch's known issues, on the outputs those issues corrupt. Then the family through
the real engine, and a build's change of one op planted (tests/support/private_ops_plant.py) and found by `diff`.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from cli_here import run_here

from harness import catalog
from harness.buildinfo import build_info
from harness.catalog.data import materialize
from harness.engine.session import RunOptions, resolve_impls, run_selection
from harness.impls import cuda_arith
from harness.judge import private_ops as contract
from harness.judge.status import Status
from harness.results.diff import ChangeKind
from harness.results.store import Store, build_key
from harness.scenarios import private_ops

pytestmark = pytest.mark.usefixtures("support_on_path")

# What CUDA's arithmetic gets wrong in the family, and on which outputs (cases/known_issues.toml says why).
TORCH_FAILS = {
    "private-ops/batch_norm_gather_stats_with_counts/empty-rank/float32-float32/ws3":
        {"mean", "invstd", "running_mean", "running_var"},  # pytorch#78656: a zero row first makes all NaN
    "private-ops/batch_norm_gather_stats_with_counts/counts-past-65504/float16-float16/ws2":
        {"mean", "invstd", "running_mean"},  # pytorch#70901: n + count is inf in float16, the mean 0
    "private-ops/batch_norm_backward_reduce/loss-scaled/float16-float32/ws2":
        {"sum_dy", "grad_bias"},  # pytorch#195701: half partials past 65,504
}
PLAIN_FLOAT32 = [f"private-ops/{op}/plain/float32-float32/ws2" for op in contract.OUTPUTS]


class CudaArithmetic:
    """cuda_arith's functions under the ATen ops' names and argument lists (its elemt takes no eps)."""

    batch_norm_stats = staticmethod(cuda_arith.batch_norm_stats)
    batch_norm_gather_stats_with_counts = staticmethod(cuda_arith.batch_norm_gather_stats_with_counts)
    batch_norm_backward_reduce = staticmethod(cuda_arith.batch_norm_backward_reduce)
    batch_norm_backward_elemt = staticmethod(cuda_arith.batch_norm_backward_elemt)

    @staticmethod
    def batch_norm_elemt(x, weight, bias, mean, invstd, eps):
        return cuda_arith.batch_norm_elemt(x, weight, bias, mean, invstd)


def judged(case, ops) -> set:
    """The outputs of ``case``'s op that fail on some rank, with ``ops``."""
    data = materialize(case)
    bad = set()
    for rank in range(case.world_size):
        args = private_ops.arguments(case, data, rank, "cpu")
        returned = getattr(ops, case.op[0])(*args)
        metrics = contract.judge(case.op[0], private_ops.expect(case, data, args),
                                 private_ops.observed(case.op[0], args, returned))
        bad |= {name.split(".", 1)[1] for name, m in metrics if not m.ok}
    return bad


def test_the_family_is_every_op_in_three_dtypes_and_four_adversarial_cases_all_by_default():
    cases = catalog.select(["private-ops/*"], exhaustive=True)
    assert len(cases) == 19 and all(c.default and c.scenario == "private_ops" for c in cases)
    assert {c.op[0] for c in cases} == set(contract.OUTPUTS) and set(TORCH_FAILS) <= {c.id for c in cases}
    assert {c.world_size for c in cases} == {2, 3}


def test_the_reference_kernels_pass_every_case_and_cudas_arithmetic_fails_the_known_three(kernels):
    for case in catalog.select(["private-ops/*"], exhaustive=True):
        assert judged(case, torch.ops.syncbn_ref) == set(), case.id
        assert judged(case, CudaArithmetic) == TORCH_FAILS.get(case.id, set()), case.id


def test_an_op_that_returns_another_number_of_outputs_fails_every_output():
    case = catalog.select([PLAIN_FLOAT32[0]])[0]
    data = materialize(case)
    args = private_ops.arguments(case, data, 0, "cpu")
    mean, invstd = cuda_arith.batch_norm_stats(*args)
    got = private_ops.observed("batch_norm_stats", args, (mean, invstd, torch.ones(1)))
    metrics = dict(contract.judge("batch_norm_stats", private_ops.expect(case, data, args), got))
    assert [m.problem for m in metrics.values()] == ["the op returned no mean", "the op returned no invstd"]


@pytest.mark.slow
def test_the_family_in_rank_processes_torch_fails_only_its_known_issues():
    cases = catalog.select(["private-ops/*"])
    records = list(run_selection(cases, resolve_impls(["reference", "torch", "textbook:TextbookSyncBN"]),
                                 RunOptions(diagnose=False)))
    by = {(r.impl, r.case): r for r in records}
    assert len(records) == 3 * len(cases)
    for case in cases:
        ref, tch, other = (by[(impl, case.id)] for impl in ("reference", "torch", "textbook:TextbookSyncBN"))
        assert ref.status is Status.PASS, (case.id, ref.message)
        assert len(ref.ranks) == case.world_size and ref.metrics
        assert tch.mode.value == "cpu-emulation"
        if case.id in TORCH_FAILS:
            assert tch.status is Status.MISMATCH and tch.known, (case.id, tch.message)
            failing = {name.split(".", 2)[2] for name, m in tch.metrics.items() if not m.ok}
            assert failing == TORCH_FAILS[case.id], (case.id, failing)
        else:
            assert tch.status is Status.PASS, (case.id, tch.message)
        assert other.status is Status.UNSUPPORTED and "private SyncBN contract" in other.message


@pytest.mark.slow
def test_diff_between_two_builds_names_the_op_whose_semantics_or_schema_changed(tmp_path):
    """The same plugin name run twice, the second time with two changes planted: the gather returns the variance
    for invstd (a change of what it computes) and batch_norm_stats takes eps by keyword (a changed schema)."""
    impl = "private_ops_plant:Planted"
    selection = ["--impl", impl, *[a for c in PLAIN_FLOAT32 for a in ("--case", c)]]

    def run(store: str, planted: str):
        env = dict(os.environ, SYNCBN_TEST_PLANTED_OPS=planted)
        return run_here(["run", *selection, "--store", str(tmp_path / store)], env=env, cwd=tmp_path)

    before, after = run("a", ""), run("b", "gather-variance,stats-keyword")
    assert before.returncode == 0, before.stderr[-3000:]
    assert after.returncode == 1, after.stderr[-3000:]
    mixed = Store(tmp_path / "mixed")
    for r in Store(tmp_path / "a").read():
        mixed.append(r)
    for r in Store(tmp_path / "b").read():
        r.torch_version, r.torch_git_version = "9.9.9+planted", "feedfacefeedface"
        mixed.append(r)
    key = build_key(build_info().torch_version, build_info().torch_git_version, "cpu", "gloo")
    out = run_here(["diff", key, "9.9.9", "--store", "mixed", "--format", "json"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    changes = {c["case"]: c for c in json.loads(out.stdout)["changes"] if c["kind"] != ChangeKind.SAME.value}
    gather, stats = PLAIN_FLOAT32[1], PLAIN_FLOAT32[0]
    assert set(changes) == {gather, stats}, changes
    assert (changes[gather]["before"], changes[gather]["after"]) == ("pass", "mismatch")
    assert "batch_norm_gather_stats_with_counts.invstd" in changes[gather]["message"]
    assert "running" not in changes[gather]["message"] and ".mean" not in changes[gather]["message"]
    assert (changes[stats]["before"], changes[stats]["after"]) == ("pass", "error")
    assert "TypeError" in changes[stats]["message"] and "positional argument" in changes[stats]["message"]
    assert all(c["regression"] for c in changes.values())
