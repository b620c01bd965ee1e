"""Multi-node mode: two torchrun agents (2 processes each, c10d rendezvous on loopback) as two nodes."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest


PATTERNS = ["allgather-shape/uneven-3-1-4-2/float32-*", "allgather-shape/uneven-2-6/float32-float32/contiguous/ws2",
            "process-group/pairs-*"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_agents_store_passing_records(tmp_path):
    port = free_port()
    store = tmp_path / "store"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=2",
           "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--max-restarts=0",
           "-m", "harness", "run", "--impl", "reference", *[arg for p in PATTERNS for arg in ("--case", p)],
           "--store", str(store), "--timeout", "120"]
    agents = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = []
    try:
        for a in agents:
            outs.append(a.communicate(timeout=600))
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
                a.wait()
    assert [a.returncode for a in agents] == [0, 0], outs
    files = list(store.glob("*.jsonl"))
    assert len(files) == 1
    records = [json.loads(line) for line in files[0].read_text().splitlines()]
    # Only the cases whose world size equals the job's (4) run, each once, written by rank 0 alone.
    ids = sorted(r["case"] for r in records)
    from harness import catalog

    selected = catalog.select(PATTERNS)
    assert any(c.world_size == 2 for c in selected)  # selected but not run: the job's world size is 4
    assert ids == sorted(c.id for c in selected if c.world_size == 4)
    for r in records:
        assert r["status"] == "pass", r["message"]
        assert [o["rank"] for o in r["ranks"]] == [0, 1, 2, 3]
        assert r["metrics"]
