"""The store's index: incremental from each file's last indexed byte, rebuilt when a file is replaced,
deletable; and a report over it that stays small whatever the store holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.results.compaction import compact
from harness.results.index import Index, refreshed
from harness.judge.status import Status
from harness.results.records import Record
from harness.results.page import MAX_FAILING
from harness.results.report import write_report
from harness.results.store import Store, StoreError, Where, build_key, latest

GIT = "cf30153c4c131c8164ee7798e5022d810682e2cb"


def record(case: str, status: Status = Status.PASS, impl: str = "torch", message: str = "",
           git: str = GIT) -> Record:
    return Record(case=case, family=case.split("/")[0], params={}, impl=impl, status=status, message=message,
                  torch_version="2.13.0+cpu", torch_git_version=git)


def latest_rows(store_dir) -> list[tuple]:
    with Store(store_dir) as store:
        return sorted((build_key(r.torch_version, r.torch_git_version, r.device, r.backend), r.impl, r.case,
                       r.status.value) for r in store.latest())


def test_updates_read_only_what_was_appended_and_rebuild_what_was_replaced(tmp_path):
    store = Store(tmp_path / "store")
    for i in range(5):
        store.append(record(f"module-config/c{i}/ws2"))
    path = store.file_for(store.builds()[0])
    with Index(store.path) as index:
        first = index.update()
        assert (first.files, first.rows, first.reindexed) == (1, 5, 0) and first.bytes_read == path.stat().st_size
        assert index.update().files == 0  # nothing new: the file is not read
    size = path.stat().st_size
    store.append(record("module-config/c0/ws2", Status.MISMATCH, message="worse"))
    with open(path, "ab") as f:
        f.write(b'{"case": "torn')  # a line still being written (or a writer killed mid-line)
    with Index(store.path) as index:
        again = index.update()
        assert (again.rows, again.reindexed) == (1, 0) and again.bytes_read == path.stat().st_size - size - 14
    rows = latest_rows(store.path)
    assert len(rows) == 5 and ("2.13.0+cpu-cf30153c4c13-cpu-gloo", "torch", "module-config/c0/ws2", "mismatch") \
        in rows
    # The torn line is completed by the next append's newline and skipped as the store's reader skips it.
    store.append(record("module-config/c5/ws2"))
    assert len(latest_rows(store.path)) == 6
    # A compaction replaces the file: the index notices and reads it from the start.
    compact(store.path)
    with Index(store.path) as index:
        assert index.update().reindexed == 1
    assert len(latest_rows(store.path)) == 6
    # The index is derived: deleting it loses nothing.
    Index(store.path).path.unlink()
    assert len(latest_rows(store.path)) == 6
    # A file removed from the store takes its rows with it.
    store.append(record("module-config/c0/ws2", git="f" * 40))
    assert len(latest_rows(store.path)) == 7
    store.file_for("2.13.0+cpu-ffffffffffff-cpu-gloo").unlink()
    assert len(latest_rows(store.path)) == 6


def test_a_newer_schema_is_refused_naming_the_release(tmp_path):
    store = Store(tmp_path / "store")
    store.append(record("module-config/c0/ws2"))
    d = record("module-config/c1/ws2").to_dict()
    d["schema_version"] = 99
    with open(store.file_for(store.builds()[0]), "a") as f:
        f.write(json.dumps(d) + "\n")
    with pytest.raises(StoreError, match="schema"):
        refreshed(store.path).close()


def test_the_report_stays_small_and_says_what_it_leaves_out(tmp_path):
    store = Store(tmp_path / "store")
    n = MAX_FAILING * 5
    for i in range(n):
        store.append(record(f"module-config/c{i}/ws2", Status.MISMATCH, message="m" * 2000))
    files = write_report(store.path, tmp_path / "out")
    page = files.html.read_text()
    assert page.count("<tr class='status-row'") == MAX_FAILING
    assert f"Failing cases ({n}, 0 of them known issues)" in page
    assert f"{n - MAX_FAILING} more failing records not shown" in page and "--csv" in page
    assert len(page) < n * 2000 / 2  # far smaller than what the records hold
    assert files.csv == []  # bulk exports are asked for
    csv = write_report(store.path, tmp_path / "out2", csv=True).csv
    assert [p.name for p in csv] == ["2.13.0+cpu-cf30153c4c13-cpu-gloo.records.csv",
                                     "2.13.0+cpu-cf30153c4c13-cpu-gloo.metrics.csv"]
    assert sum(1 for _ in open(csv[0])) == n + 1


def test_one_builds_latest_records_read_through_the_index_touch_only_that_file(tmp_path):
    store = Store(tmp_path / "store")
    for git in (GIT, "f" * 40):
        for run, status in enumerate((Status.PASS, Status.MISMATCH)):
            for i in range(3):
                store.append(record(f"module-config/c{i}/ws2", status, message=f"run {run}", git=git))
    key = "2.13.0+cpu-cf30153c4c13-cpu-gloo"
    with Store(store.path) as reader:
        got = list(reader.latest(Where(build=key)))
        assert reader.count(Where(build=key, statuses=("mismatch",))) == 3
    assert [(r.case, r.message) for r in got] == [(f"module-config/c{i}/ws2", "run 1") for i in range(3)]
    with Index(store.path) as index:
        assert index.db.execute("SELECT name FROM files").fetchall() == [(f"{key}.jsonl",)]


def test_the_store_and_a_list_of_its_records_agree_on_the_latest(tmp_path):
    store = Store(tmp_path / "store")
    for run in range(3):
        for git in (GIT, "f" * 40):
            for i in range(4 - run):
                store.append(record(f"module-config/c{i}/ws2", message=f"run {run}", git=git,
                                    impl=("torch", "reference")[i % 2]))
    with Store(store.path) as reader:
        from_index = [r.to_dict() for r in reader.latest()]
        assert reader.count() == len(from_index) == 8
    assert from_index == [r.to_dict() for r in latest(store.read())]
    # Appending through the same Store object: its next question reads the new line too.
    with Store(store.path) as same:
        assert same.count() == 8
        same.append(record("module-config/c9/ws2", git=GIT))
        assert same.count() == 9 and same.count(Where(build="2.13.0+cpu-cf30153c4c13-cpu-gloo")) == 5


def test_the_store_answers_counts_and_reads_by_condition_without_sql_outside_the_index(tmp_path):
    store = Store(tmp_path / "store")
    for i, status in enumerate([Status.PASS, Status.MISMATCH, Status.CRASH, Status.PASS]):
        store.append(record(f"module-config/c{i}/ws2", status=status, impl="torch" if i % 2 else "reference"))
    store.append(record("module-config/c1/ws2", status=Status.PASS, impl="torch"))  # supersedes the mismatch
    with Store(store.path) as asked:
        assert asked.count() == 4
        assert asked.count(Where(statuses=("mismatch", "crash"))) == 1
        assert asked.count(Where(impl="torch")) == 2 and asked.impls() == ["reference", "torch"]
        assert [r.case for r in asked.latest(Where(impl="reference"), order="by-impl")] == [
            "module-config/c0/ws2", "module-config/c2/ws2"]
        assert len(list(asked.latest(limit=3))) == 3
        assert asked.sample("torch", 5) == []  # none of them compared a tensor
        assert asked.pairs(Where(statuses=("crash",))) == {("reference", "module-config/c2/ws2")}
        assert asked.count(Where(known=True)) == 0
        assert sorted(asked.tally())[0] == ("2.13.0+cpu-cf30153c4c13-cpu-gloo", "reference", "module-config",
                                            "crash", False, 1)
        with pytest.raises(ValueError, match="order 'worst'"):
            asked.latest(order="worst")
    with refreshed(store.path) as index, pytest.raises(ValueError, match="impl or build"):
        index.distinct("status")
    import harness

    root = Path(harness.__file__).parent
    outside = [str(p.relative_to(root)) for p in root.rglob("*.py")
               if p.name != "index.py" and "SELECT " in p.read_text()]
    assert not outside, f"SQL outside harness/results/index.py: {outside}"
