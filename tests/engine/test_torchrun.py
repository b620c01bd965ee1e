"""Multi-node mode: two torchrun agents (2 processes each, c10d rendezvous on loopback) as two nodes.

A passing selection is written once, by rank 0. A rank that raises, segfaults
or hangs is recorded, attributed to that rank, and the job ends promptly with
exit 1: the failure is never lost to a timeout of the whole job.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_here import run_here

from harness import catalog
from harness.engine.waiting import PEER_GRACE_S

SUPPORT = str(Path(__file__).resolve().parents[1] / "support")
PATTERNS = ["allgather-shape/uneven-3-1-4-2/float32-*", "allgather-shape/uneven-2-6/float32-float32/contiguous/ws2",
            "process-group/pairs-*"]
FAILING_CASE = "allgather-shape/uneven-3-1-4-2/float32-float32/contiguous/ws4"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_agents(tmp_path, *run_args, timeout=600):
    """Two torchrun agents of 2 processes each running `python -m harness run`; (exit codes, outputs, records)."""
    port = free_port()
    store = tmp_path / "store"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=2",
           "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--max-restarts=0",
           "-m", "harness", "run", *run_args, "--store", str(store)]
    # TMPDIR: torch's elastic agent makes a log folder there and leaves it behind; let it be the test's.
    env = dict(os.environ, PYTHONPATH=SUPPORT + os.pathsep + os.environ.get("PYTHONPATH", ""), TMPDIR=str(tmp_path))
    agents = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               start_new_session=True) for _ in range(2)]
    outs = []
    try:
        for a in agents:
            outs.append(a.communicate(timeout=timeout))
    finally:
        for a in agents:
            if a.poll() is None:
                os.killpg(a.pid, 9)
                a.wait()
    files = list(store.glob("*.jsonl"))
    records = [json.loads(line) for f in files for line in f.read_text().splitlines() if line.strip()]
    return [a.returncode for a in agents], outs, records


@pytest.mark.slow(16)
def test_two_agents_store_passing_records(tmp_path):
    codes, outs, records = two_agents(tmp_path, "--impl", "reference",
                                      *[arg for p in PATTERNS for arg in ("--case", p)], "--timeout", "120")
    assert fixed_codes(codes, outs) == [0, 0], job_report(codes, outs, records)
    # Only the cases whose world size equals the job's (4) run, each once, written by rank 0 alone.
    selected = catalog.select(PATTERNS)
    assert any(c.world_size == 2 for c in selected)  # selected but not run: the job's world size is 4
    assert sorted(r["case"] for r in records) == sorted(c.id for c in selected if c.world_size == 4)
    for r in records:
        if r["params"].get("backend"):
            # A torchrun job has the one process group it was started with: a case on another backend says so.
            assert r["status"] == "unsupported" and "--backend nccl-contract" in r["message"], r["message"]
            continue
        assert r["status"] == "pass", r["message"]
        assert [o["rank"] for o in r["ranks"]] == [0, 1, 2, 3]
        assert r["metrics"]
    assert any(r["status"] == "pass" for r in records)


def fixed_codes(codes, outs):
    """Exit codes with torchrun's c10d teardown race forgiven: the agent hosting the rendezvous store may be gone
    when the other shuts its rendezvous down, which then exits 1 after a job whose workers all succeeded."""
    return [0 if code == 1 and "failed to shutdown the rendezvous" in err and "ChildFailedError" not in err
            else code for code, (_, err) in zip(codes, outs)]


def job_report(codes, outs, records) -> str:
    """What a failed job left, whole: its exit codes, its records' messages (which rank, and what it did) and
    the end of each agent's output."""
    lines = [f"exit codes {codes}"]
    lines += [f"record {r['case']} [{r['impl']}]: {r['status']}: {r['message']}" for r in records]
    for i, (out, err) in enumerate(outs):
        lines += [f"--- agent {i} stdout (end)", out[-3000:], f"--- agent {i} stderr (end)", err[-6000:]]
    return "\n".join(lines)


@pytest.mark.sweep(21)
@pytest.mark.slow
def test_resume_under_torchrun_runs_only_what_the_store_lacks(tmp_path):
    """The writing rank reads the store once, before anything is appended; every rank runs its pending pairs."""
    first = "allgather-shape/uneven-3-1-4-2/float32-float32/contiguous/ws4"
    codes, outs, records = two_agents(tmp_path, "--impl", "reference", "--case", first, "--timeout", "120")
    assert fixed_codes(codes, outs) == [0, 0], job_report(codes, outs, records)
    assert [r["case"] for r in records] == [first]
    codes, outs, records = two_agents(tmp_path, "--impl", "reference", "--resume",
                                      *[arg for p in PATTERNS for arg in ("--case", p)], "--timeout", "120")
    assert fixed_codes(codes, outs) == [0, 0], job_report(codes, outs, records)
    cases = [r["case"] for r in records]
    assert len(cases) == len(set(cases)), "a stored pair ran again"
    assert sorted(cases) == sorted(c.id for c in catalog.select(PATTERNS) if c.world_size == 4)


@pytest.mark.slow
@pytest.mark.sweep(58)
@pytest.mark.parametrize("probe,status,how", [("RaiseOnRank1", "error", "RuntimeError"),
                                              ("SegfaultOnRank1", "crash", "SIGSEGV"),
                                              ("SleepOnRank1", "hang", "misbehave")])
def test_a_failing_rank_is_recorded_and_attributed_and_the_job_ends(tmp_path, probe, status, how):
    t0 = time.monotonic()
    codes, outs, records = two_agents(tmp_path, "--impl", f"probes:{probe}", "--case", FAILING_CASE,
                                      "--timeout", "20", "--format", "json")
    elapsed = time.monotonic() - t0
    assert 1 in codes and all(c != 0 for c in codes), (codes, outs)
    assert elapsed < 150, f"the job took {elapsed:.0f}s to end"
    [record] = records
    assert record["case"] == FAILING_CASE and record["status"] == status, record["message"]
    by_rank = {o["rank"]: o for o in record["ranks"]}
    assert sorted(by_rank) == [0, 1, 2, 3]
    culprit = by_rank[1]
    assert culprit["status"] == status
    evidence = " ".join(str(culprit.get(k) or "") for k in ("exception_type", "signal", "stack_dump", "message"))
    assert how in evidence, culprit
    assert all(by_rank[r]["status"] == "peer-failed" for r in (0, 2, 3)), by_rank
    assert record["message"].startswith(f"rank 1: {status}")
    # The writer printed the run's output (the JSON array) before the job ended.
    printed = [json.loads(out) for out, _ in outs if out.strip().startswith("[")]
    assert [[r["status"] for r in p] for p in printed] == [[status]]


@pytest.mark.slow(16)
def test_compare_runs_under_torchrun_as_in_the_local_pool(tmp_path):
    """``run --compare A,B`` under torchrun: A's record says how it differs from B, as a local run's does."""
    case = "allgather-shape/uneven-2-6/float32-float32/contiguous/ws2"
    store = tmp_path / "store"
    args = ["run", "--impl", "torch", "--impl", "reference", "--compare", "torch,reference", "--case", case,
            "--device", "cpu", "--timeout", "120", "--store", str(store), "--format", "json"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--max-restarts=0",
           "-m", "harness", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, start_new_session=True,
                          env=dict(os.environ, TMPDIR=str(tmp_path)))
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = {r["impl"]: r for f in store.glob("*.jsonl") for r in map(json.loads, f.read_text().splitlines())}
    assert set(records) == {"torch", "reference"}
    torch_rec = records["torch"]
    assert torch_rec["compare"] is not None, "the torchrun job ran A without B: --compare was dropped"
    assert torch_rec["compare"]["with"] == "reference"
    assert torch_rec["compare"]["max_abs_diff"], torch_rec["compare"]
    assert records["reference"]["compare"] is None  # only A is compared
    local = run_here([*args[:-2], "--store", str(tmp_path / "local"), "--format", "json"])  # the local pool, here
    assert local.returncode == 0, local.stderr[-4000:]
    [local_torch] = [r for r in json.loads(local.stdout) if r["impl"] == "torch"]
    assert set(local_torch["compare"]["max_abs_diff"]) == set(torch_rec["compare"]["max_abs_diff"])


CRASH_CASE = "allgather-shape/uneven-2-6/float32-float32/contiguous/ws2"


def one_node_job(tmp_path: Path, name: str, cache: Path, run_id: str = "job42") -> subprocess.Popen:
    """A single-node torchrun job of 2 ranks (its own rendezvous endpoint, the given --rdzv-id) whose rank 1
    segfaults; stdout is its records as JSON."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2", "--rdzv-backend=c10d",
           f"--rdzv-endpoint=127.0.0.1:{free_port()}", f"--rdzv-id={run_id}", "--max-restarts=0",
           "-m", "harness", "run", "--impl", "probes:SegfaultOnRank1", "--case", CRASH_CASE, "--timeout", "30",
           "--format", "json", "--store", str(tmp_path / f"store-{name}")]
    env = dict(os.environ, PYTHONPATH=SUPPORT + os.pathsep + os.environ.get("PYTHONPATH", ""), TMPDIR=str(tmp_path),
               SYNCBN_HARNESS_CACHE=str(cache))
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)


def finish(job: subprocess.Popen) -> list[dict]:
    try:
        out, err = job.communicate(timeout=300)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, 9)
            job.wait()
    printed = [line for line in out.splitlines() if line.startswith("[")]
    assert printed, err[-3000:]
    return json.loads(out[out.index("["):])


@pytest.mark.slow(30)
def test_jobs_sharing_a_rendezvous_id_keep_their_own_crash_reports(tmp_path, own_cache):
    cache = own_cache  # its torchrun folder is the test's alone; the probes' reference kernels are not rebuilt
    # The old predictable place of the crash reports, planted as a link to a folder that must stay untouched.
    victim = tmp_path / "victim"
    victim.mkdir()
    (tmp_path / "syncbn-harness-job42").symlink_to(victim, target_is_directory=True)
    side_by_side = [one_node_job(tmp_path, name, cache) for name in ("a", "b")]
    records = [finish(job) for job in side_by_side]
    records.append(finish(one_node_job(tmp_path, "c", cache)))  # one after the other
    for [r] in records:
        assert r["status"] == "crash" and r["message"].startswith("rank 1: crash"), r["message"]
        culprit = next(o for o in r["ranks"] if o["rank"] == 1)
        assert culprit["signal"] == "SIGSEGV" and "Segmentation fault" in (culprit["stack_dump"] or ""), culprit
    folders = sorted((cache / "torchrun").glob("job42-agent*"))
    assert len(folders) == 3, folders  # one per job, each kept with its crash report
    assert all((f / "rank1.fault").read_text().count("Segmentation fault") == 1 for f in folders)
    assert list(victim.iterdir()) == []


@pytest.mark.slow(20)
@pytest.mark.parametrize("probe,status", [("RaiseOnRank1", "error"), ("SegfaultOnRank1", "crash")])
def test_a_failure_that_leaves_its_peer_in_a_collective_ends_the_wait_at_once(tmp_path, probe, status):
    """Rank 1 raises (or dies) before the all_gather that rank 0 is already inside: the waiting rule proves rank 0
    stuck from the collectives each rank posted (or, after a death, the dumps are awaited only as long as a live
    rank has not posted its own), and the case ends well within the failure's grace, as in the local pool.

    (A passing run of the same case earlier in the job is no baseline: as the job's first task it pays for what
    the first forward imports and loads, seconds on a loaded machine; so the grace is the bound.)"""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--max-restarts=0",
           "-m", "harness", "run", "--impl", "reference", "--impl", f"probes:{probe}", "--case", CRASH_CASE,
           "--timeout", "60", "--format", "json", "--store", str(tmp_path / "store")]
    env = dict(os.environ, PYTHONPATH=SUPPORT + os.pathsep + os.environ.get("PYTHONPATH", ""), TMPDIR=str(tmp_path))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, start_new_session=True, env=env)
    assert proc.returncode != 0, proc.stderr[-4000:]
    records = {r["impl"]: r for f in (tmp_path / "store").glob("*.jsonl")
               for r in map(json.loads, f.read_text().splitlines())}
    assert records["reference"]["status"] == "pass", records["reference"]["message"]  # the pool is warm now
    bad = records[f"probes:{probe}"]
    assert bad["status"] == status and bad["message"].startswith(f"rank 1: {status}"), bad["message"]
    assert next(o for o in bad["ranks"] if o["rank"] == 0)["status"] == "peer-failed", bad["ranks"]
    assert bad["duration_s"] < PEER_GRACE_S / 2, bad["duration_s"]
