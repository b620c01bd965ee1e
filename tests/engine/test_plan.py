"""The plan, with scripted input: a store holding some of a selection's records, and torchrun's environment.

No case runs here: the plan decides what would run, and that is what is checked (the runs themselves are in
tests/commands and tests/engine/test_torchrun.py).
"""

from __future__ import annotations

import pytest

from harness.engine import assemble, launcher
from harness.engine.launcher import LocalPools, TorchrunJob
from harness.engine.plan import make_plan
from harness.judge.status import Status
from harness.results.store import Store
from harness.selection import Selection

SELECTION = Selection(impls=("reference", "torch"), case_patterns=("module-config/momentum-0.5/*",), device="cpu")
TORCHRUN = {"TORCHELASTIC_RUN_ID": "t", "WORLD_SIZE": "2"}


def _store_one_pass(store_dir) -> tuple:
    """Store a pass of the selection's first case for the reference; return that (case id, impl) pair."""
    plan = make_plan(SELECTION)
    case, impl = plan.cases[0], plan.impls[0]
    record = assemble.not_run(case, impl, plan.info, plan.opts.device, plan.opts.resolved_backend, Status.PASS, "")
    Store(store_dir).prepare(plan.key)
    Store(store_dir).append(record)
    return case.id, impl.name


@pytest.fixture
def local(monkeypatch):
    for name in ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def test_without_a_store_the_plan_runs_every_pair_locally(local):
    plan = make_plan(SELECTION)
    assert isinstance(plan.launcher, LocalPools) and plan.pairs is None and plan.store_dir is None
    assert plan.to_run == plan.selected == len(plan.cases) * 2


def test_resume_leaves_out_what_the_store_holds_and_outputs_it_first_met(local, tmp_path):
    done = _store_one_pass(tmp_path)
    plan = make_plan(SELECTION, store_dir=str(tmp_path), resume=True)
    assert done not in plan.pairs and plan.to_run == plan.selected - 1
    assert list(plan.stored) == [done]
    assert [(r.case, r.impl) for r in plan.output([])] == [done]


def test_explicit_cases_replace_the_selection(local):
    assert make_plan(SELECTION, cases=[]).cases == []
    assert make_plan(SELECTION, cases=[]).to_run == 0


def test_resume_needs_a_store(local):
    with pytest.raises(ValueError, match="resume needs a store"):
        make_plan(SELECTION, resume=True)


@pytest.mark.parametrize("rank, reads", [("0", True), ("1", False)])
def test_under_torchrun_only_the_writing_rank_reads_the_store(monkeypatch, tmp_path, rank, reads):
    done = _store_one_pass(tmp_path)
    monkeypatch.setenv("RANK", rank)
    for name, value in TORCHRUN.items():
        monkeypatch.setenv(name, value)
    plan = make_plan(SELECTION, store_dir=str(tmp_path), resume=True)
    assert isinstance(plan.launcher, TorchrunJob) and plan.launcher.world == 2
    if reads:  # its pending pairs reach the other ranks at the job's start
        assert done not in plan.pairs and plan.to_run == plan.selected - 1
    else:
        assert plan.pairs is None and plan.to_run == plan.selected


def test_the_launcher_is_chosen_from_torchruns_environment_and_counts_the_jobs_world_size_only(local):
    assert isinstance(launcher.choose({}), LocalPools)
    assert isinstance(launcher.choose({"TORCHELASTIC_RUN_ID": "t", "WORLD_SIZE": "2"}), LocalPools)  # no RANK
    job = launcher.choose({**TORCHRUN, "RANK": "1"})
    assert isinstance(job, TorchrunJob) and (job.world, job.rank) == (2, 1)
    plan = make_plan(Selection(impls=("reference",), case_patterns=("allgather-shape/uneven-2-6/*",
                                                                    "allgather-shape/uneven-3-1-4-2/*"), device="cpu"))
    sizes = [c.world_size for c in plan.cases]
    assert 2 in sizes and 4 in sizes
    assert plan.to_run == len(plan.cases)  # locally every pair runs
    plan.launcher = TorchrunJob(world=4, rank=0)
    assert plan.to_run == sizes.count(4)  # a job of four ranks runs the cases of four ranks only
    assert not job.reads_store(resume=True) and TorchrunJob(2, 0).reads_store(resume=True)
    assert not TorchrunJob(2, 0).reads_store(resume=False) and LocalPools().reads_store(resume=False)


def test_a_torchrun_job_refuses_a_session_and_starts_nothing_early(local):
    from harness.errors import UsageError

    plan = make_plan(SELECTION, cases=[], launcher=TorchrunJob(world=2, rank=0))
    with pytest.raises(UsageError, match="run it without torchrun"):
        plan.launcher.session(plan)
    assert plan.launcher.prewarm(True) is None and not plan.launcher.announces
