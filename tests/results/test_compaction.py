"""``store stats`` and ``store compact``: superseded records dropped, the latest kept byte for byte, and a
compaction killed (SIGKILL) at any of its steps loses nothing."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
from cli_here import run_here

from harness.results.compaction import STEPS, compact, stats
from harness.judge.status import Status
from harness.results.records import Record
from harness.results.store import Store, StoreError, latest

KEY = "2.13.0+cpu-cf30153c4c13-cpu-gloo"


def record(case: str, impl: str, status: Status, message: str = "") -> Record:
    return Record(case=case, family=case.split("/")[0], params={}, impl=impl, status=status, message=message,
                  torch_version="2.13.0+cpu", torch_git_version="cf30153c4c131c8164ee7798e5022d810682e2cb")


def make_store(path) -> Store:
    """Three runs over four (impl, case) pairs, a torn tail from a killed writer, then one more record."""
    store = Store(path)
    cases = ["module-config/affine-off/ws2", "allgather-shape/uneven-2-6/ws2"]
    for run in range(3):
        for impl in ("torch", "reference"):
            for case in cases:
                store.append(record(case, impl, Status.PASS if run < 2 else Status.MISMATCH, f"run {run}"))
    with open(store.file_for(KEY), "ab") as f:
        f.write(b'{"case": "module-config/affine-off/ws2", "impl": "tor')  # a writer killed mid-line
    store.append(record(cases[0], "torch", Status.CRASH, "run 3"))
    return store


def latest_dicts(store: Store) -> list[dict]:
    return sorted((r.to_dict() for r in latest(store.read())), key=lambda d: (d["impl"], d["case"]))


def test_stats_count_and_compact_keeps_exactly_what_readers_read(tmp_path):
    store = make_store(tmp_path / "store")
    before = latest_dicts(store)
    [s] = stats(store.path)
    assert (s.key, s.records, s.latest, s.superseded, s.torn) == (KEY, 13, 4, 9, 1)
    lines = store.file_for(KEY).read_bytes().splitlines(keepends=True)
    [c] = compact(store.path)
    assert (c.records_before, c.records_after, c.torn_dropped) == (13, 4, 1) and c.bytes_after < c.bytes_before
    assert latest_dicts(store) == before
    after = store.file_for(KEY).read_bytes().splitlines(keepends=True)
    assert all(line in lines for line in after)  # byte for byte as written, in file order
    assert [json.loads(x)["message"] for x in after] == ["run 2", "run 2", "run 2", "run 3"]
    [s] = stats(store.path)
    assert (s.records, s.superseded, s.torn) == (4, 0, 0)
    assert not list(store.path.glob(".*compact*"))
    # Appending goes on as before.
    store.append(record("module-config/affine-off/ws2", "torch", Status.PASS, "run 4"))
    assert [d["message"] for d in latest_dicts(store)] == ["run 2", "run 2", "run 2", "run 4"]


@pytest.mark.parametrize("step", STEPS)
def test_a_compaction_killed_at_any_step_loses_nothing(tmp_path, step):
    store = make_store(tmp_path / "store")
    before, original = latest_dicts(store), store.file_for(KEY).read_bytes()
    reference = make_store(tmp_path / "reference")
    compact(reference.path)
    compacted = reference.file_for(KEY).read_bytes()
    env = {**os.environ, "SYNCBN_HARNESS_KILL_AT": f"compact:{step}"}
    proc = subprocess.run([sys.executable, "-m", "harness", "store", "compact", "--store", str(store.path)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr)
    assert store.file_for(KEY).read_bytes() in (original, compacted)
    assert latest_dicts(store) == before
    # The next compaction finishes the job and leaves nothing aside.
    compact(store.path)
    assert store.file_for(KEY).read_bytes() == compacted and latest_dicts(store) == before
    assert not list(store.path.glob(".*compact*"))


def test_newer_records_refuse_compaction_and_nothing_changes(tmp_path):
    store = make_store(tmp_path / "store")
    d = record("module-config/affine-off/ws2", "torch", Status.PASS).to_dict()
    d["schema_version"] = 99
    with open(store.file_for(KEY), "a") as f:
        f.write(json.dumps(d) + "\n")
    data = store.file_for(KEY).read_bytes()
    with pytest.raises(StoreError, match="schema 99, newer than this harness reads"):
        compact(store.path)
    assert store.file_for(KEY).read_bytes() == data


def test_the_commands_print_and_refuse_a_missing_store(tmp_path):
    make_store(tmp_path / "store")
    # In this process (tests/support/cli_here.py): what the commands print and refuse.
    out = run_here(["store", "stats", "--store", str(tmp_path / "store")])
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[1].split()[:5] == [KEY, "13", "4", "9", "1"]
    assert "1 builds, 13 records (9 superseded)" in out.stdout
    out = run_here(["store", "compact", "--store", str(tmp_path / "store")])
    assert out.returncode == 0 and out.stdout.startswith(f"{KEY}: 13 -> 4 records, "), out.stderr
    out = run_here(["store", "stats", "--store", str(tmp_path / "nosuch")])
    assert out.returncode == 2 and "does not exist" in out.stderr
    shutil.rmtree(tmp_path / "store")
