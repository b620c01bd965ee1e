"""The store: durable appends, torn lines, schema refusal and migration, concurrent writers, kill and resume.

The run tests are real: `syncbn-harness run` subprocesses with a plugin
implementation written here (its forward sleeps, so a run can be killed
midway), real rank processes, real files.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from cli_here import run_here
from proctools import wait_until

from harness import SCHEMA_VERSION, __version__
from harness.results import reader as reader_mod
from harness.results import store as store_mod
from harness.buildinfo import build_info
from harness.judge.metric import Metric
from harness.judge.mode import Mode
from harness.judge.status import RankOutcome, RankStatus, Status
from harness.results.records import Overlay, Record
from harness.results.store import Store, StoreError, build_key, read_file

PLUGIN = textwrap.dedent("""
    import os
    import time

    from harness.impls.reference import SyncBatchNorm


    class Slow(SyncBatchNorm):
        \"\"\"The reference, sleeping SYNCBN_TEST_SLEEP seconds per forward.\"\"\"

        def forward(self, input):
            time.sleep(float(os.environ.get("SYNCBN_TEST_SLEEP", "0")))
            return super().forward(input)
""")


def make_record(case="allgather-shape/x/ws2", impl="reference", status=Status.PASS, **kw) -> Record:
    base = dict(case=case, family=case.split("/")[0], params={"dtype": "float32"}, impl=impl, status=status,
                torch_version="2.13.0+cpu", torch_git_version="cf30153c4c13aaaa", device="cpu", backend="gloo",
                world_size=2, started_at="2026-11-22T05:00:00+00:00", host="h",
                ranks=[RankOutcome(0, RankStatus.PASS), RankOutcome(1, RankStatus.PASS)],
                metrics={"rank0.step0.train.output": Metric(1e-7, 1e-7, 1e-5, 0.01)})
    base.update(kw)
    return Record(**base)


def this_build_key() -> str:
    info = build_info()
    return build_key(info.torch_version, info.torch_git_version, "cpu", "gloo")


def small_selection(n: int) -> list[str]:
    """IDs of ``n`` cheap default cases (float32, two ranks), read from the catalog as it is today."""
    from harness import catalog

    ids = [c.id for c in catalog.select(world_sizes=[2])
           if c.dtype == "float32" and c.param_dtype == "float32" and c.groups is None]
    assert len(ids) >= n, ids
    return ids[:n]


def harness_env(tmp_path: Path, **extra) -> dict:
    (tmp_path / "tsplug.py").write_text(PLUGIN)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    env.update(extra)
    return env


def run_cmd(args, env):
    """The command run in this process (tests/support/cli_here.py); the tests of killing a run start their own."""
    return run_here(args, env=env)


# --- the file format --------------------------------------------------------------------------------------------

def test_append_then_read_round_trips_one_line_per_record(tmp_path):
    store = Store(tmp_path / "s")
    records = [make_record(case=f"numerics/c{i}/ws2") for i in range(3)]
    for r in records:
        path = store.append(r)
    assert path.name == "2.13.0+cpu-cf30153c4c13-cpu-gloo.jsonl"
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 4
    first = json.loads(lines[0])
    assert first["schema_version"] == SCHEMA_VERSION and first["harness_version"] == __version__
    assert [r.to_dict() for r in store.read()] == [r.to_dict() for r in records]
    assert store.builds() == ["2.13.0+cpu-cf30153c4c13-cpu-gloo"]


def test_torn_last_line_is_dropped_with_a_warning_and_the_next_append_starts_a_fresh_line(tmp_path, caplog):
    store = Store(tmp_path / "s")
    path = store.append(make_record(case="numerics/a/ws2"))
    whole = json.dumps(make_record(case="numerics/torn/ws2").to_dict())
    with open(path, "ab") as f:
        f.write(whole[:57].encode())  # what a writer killed mid-line leaves
    with caplog.at_level(logging.WARNING, logger="harness.results.store"):
        assert [r.case for r in store.read()] == ["numerics/a/ws2"]
    assert "torn last line" in caplog.text and str(path) in caplog.text

    store.append(make_record(case="numerics/b/ws2"))
    lines = path.read_bytes().split(b"\n")
    assert lines[1] == whole[:57].encode(), "the torn fragment must stay on a line of its own"
    assert json.loads(lines[2])["case"] == "numerics/b/ws2"
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="harness.results.store"):
        assert [r.case for r in store.read()] == ["numerics/a/ws2", "numerics/b/ws2"]
    assert "corrupt line 2" in caplog.text


def test_a_newer_schema_is_refused_naming_the_release_needed(tmp_path):
    path = tmp_path / "b.jsonl"
    newer = dict(make_record().to_dict(), schema_version=SCHEMA_VERSION + 1, harness_version="0.7.0")
    path.write_text(json.dumps(newer) + "\n")
    with pytest.raises(StoreError) as info:
        read_file(path)
    msg = str(info.value)
    assert f"schema_version {SCHEMA_VERSION + 1}" in msg and "upgrade syncbn-harness to 0.7.0" in msg
    assert str(path) in msg and info.value.exit_code == 3


def test_an_older_schema_is_migrated_on_read(tmp_path, monkeypatch):
    old = make_record(message="a message the migration must carry over").to_dict()
    old["schema_version"] = SCHEMA_VERSION
    old["legacy_message"] = old.pop("message")
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(old) + "\n")

    def to_next(d):
        d["message"] = d.pop("legacy_message")
        d["schema_version"] = SCHEMA_VERSION + 1
        return d

    monkeypatch.setattr(reader_mod, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    monkeypatch.setitem(reader_mod.MIGRATIONS, SCHEMA_VERSION, to_next)
    [record] = read_file(path)
    assert record.message == "a message the migration must carry over"
    assert record.schema_version == SCHEMA_VERSION + 1


def schema_1(record: Record) -> dict:
    """``record`` as the first schema wrote it: an overlay said only in words, in its torch_git_version."""
    d = record.to_dict()
    d.pop("overlay")
    d.pop("schema_version")  # the first format did not always say
    return d


@pytest.mark.parametrize("left_out", [0, 3])
def test_schema_1_overlay_records_read_and_key_as_before_with_the_overlay_a_field(tmp_path, left_out):
    overlay = Overlay("a" * 40, "b" * 40, left_out)
    words = overlay.describe()
    assert words == f"overlay of {'a' * 40} on {'b' * 40}" + (" (approximate: 3 compiled files left out)"
                                                               if left_out else "")
    key = f"2.13.0+cpu-{'a' * 12}-on-{'b' * 12}-cpu-gloo"  # what schema 1 keyed it as, from the words
    store = Store(tmp_path / "s")
    store.path.mkdir()
    old = make_record(case="numerics/old/ws2", torch_git_version=words)
    store.file_for(key).write_text(json.dumps(schema_1(old)) + "\n")
    # A record of this harness, the overlay a field, goes to the same file.
    assert store.append(make_record(case="numerics/new/ws2", torch_git_version=words, overlay=overlay)).name \
        == f"{key}.jsonl"
    assert store.builds() == [key]
    read = read_file(store.file_for(key))
    assert [(r.case, r.overlay, r.torch_git_version, store_mod.record_key(r)) for r in read] == [
        ("numerics/old/ws2", overlay, words, key), ("numerics/new/ws2", overlay, words, key)]
    assert all(r.schema_version == SCHEMA_VERSION for r in read)
    with Store(store.path) as asked:
        assert [r.overlay for r in asked.latest(store_mod.Where(build=key))] == [overlay, overlay]
        assert asked.build_identities() == [(key, words, "a" * 40, left_out)]
    # Not an overlay, in either schema: no overlay, the commit's 12 digits.
    plain = make_record()
    [again] = read_file(_written(tmp_path / "plain.jsonl", schema_1(plain)))
    assert again.overlay is None and store_mod.record_key(again) == "2.13.0+cpu-cf30153c4c13-cpu-gloo"


@pytest.mark.parametrize("said, mode, notes", [
    ("cpu-emulation; DDP's CPU SyncBatchNorm check skipped", Mode.CPU_EMULATION,
     ("DDP's CPU SyncBatchNorm check skipped",)),
    ("python-fallback (nvtx no-op)", Mode.PYTHON_FALLBACK, ("nvtx no-op",)),
    ("stats_mode='N' from detectron2", Mode.NATIVE, ("stats_mode='N'", "from detectron2")),
    ("native", Mode.NATIVE, ()),
    (None, None, ()),
    ("a plugin's own words", None, ("a plugin's own words",)),  # no mode named: nothing is lost
])
def test_schema_2_modes_with_words_after_them_read_as_the_mode_and_its_notes(tmp_path, said, mode, notes):
    d = make_record().to_dict()
    d.pop("mode_notes")
    d.update(mode=said, schema_version=2)
    [record] = read_file(_written(tmp_path / "two.jsonl", d))
    assert (record.mode, record.mode_notes, record.schema_version) == (mode, notes, SCHEMA_VERSION)
    assert record.emulated is (mode is Mode.CPU_EMULATION)


def test_a_mode_that_is_not_one_of_the_modes_is_refused_naming_it(tmp_path):
    d = dict(make_record().to_dict(), mode="cpu-emulation; a note")
    with pytest.raises(StoreError, match="not a syncbn-harness record") as info:
        read_file(_written(tmp_path / "b.jsonl", d))
    assert "mode 'cpu-emulation; a note' is not one of native, cpu-emulation" in str(info.value)


def _written(path: Path, d: dict) -> Path:
    path.write_text(json.dumps(d) + "\n")
    return path


@pytest.mark.parametrize("bad", [{"commit": "a b", "base": "c"}, {"commit": "a", "base": "c", "left_out": -1},
                                 {"commit": "a"}, {"commit": 5, "base": "c"}, {"commit": "a", "base": "c",
                                                                              "left_out": True}])
def test_a_bad_overlay_field_is_refused_naming_the_file_and_the_value(tmp_path, bad):
    d = make_record().to_dict()
    d["overlay"] = bad
    path = _written(tmp_path / "b.jsonl", d)
    with pytest.raises(StoreError, match="not a syncbn-harness record") as info:
        read_file(path)
    assert str(path) in str(info.value) and "overlay" in str(info.value)


def test_run_json_array_is_read_like_a_store_file(tmp_path):
    records = [make_record(case="numerics/a/ws2"), make_record(case="numerics/b/ws2", status=Status.CRASH)]
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps([r.to_dict() for r in records], indent=2))
    assert [(r.case, r.status) for r in read_file(path)] == [("numerics/a/ws2", Status.PASS),
                                                             ("numerics/b/ws2", Status.CRASH)]


def test_latest_keeps_the_last_record_of_each_pair():
    a1 = make_record(case="numerics/a/ws2", status=Status.CRASH)
    b = make_record(case="numerics/b/ws2")
    a2 = make_record(case="numerics/a/ws2")
    other_build = dataclasses.replace(a1, torch_git_version="0123456789abcdef")
    out = store_mod.latest([a1, b, a2, other_build])
    assert [(r.case, r.status, r.torch_git_version[:4]) for r in out] == [
        ("numerics/b/ws2", Status.PASS, "cf30"), ("numerics/a/ws2", Status.PASS, "cf30"),
        ("numerics/a/ws2", Status.CRASH, "0123")]


def test_unknown_build_prefix_lists_the_builds(tmp_path):
    store = Store(tmp_path)
    store.append(make_record())
    store.append(make_record(torch_version="2.14.1+cu130", torch_git_version="5ebf4d5e7c01ffff"))
    assert store.resolve_build("2.14") == "2.14.1+cu130-5ebf4d5e7c01-cpu-gloo"
    with pytest.raises(store_mod.UsageError) as info:
        store.resolve_build("2.")
    assert "ambiguous" in str(info.value) and "2.13.0+cpu-cf30153c4c13-cpu-gloo" in str(info.value)
    with pytest.raises(store_mod.UsageError) as info:
        store.resolve_build("1.13")
    assert "'1.13' matches no build" in str(info.value) and "2.14.1+cu130-5ebf4d5e7c01-cpu-gloo" in str(info.value)


def test_unwritable_store_is_an_error_naming_the_directory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(StoreError) as info:
        Store(blocker / "store").append(make_record())
    assert str(blocker / "store") in str(info.value) and "--store" in str(info.value)


# --- concurrent writers -----------------------------------------------------------------------------------------

WRITER = textwrap.dedent("""
    import sys
    from harness.judge.status import RankOutcome, RankStatus, Status
    from harness.results.records import Overlay, Record
    from harness.results.store import Store

    store, tag, n = Store(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    for i in range(n):
        # 20 KB per line: far beyond PIPE_BUF, so only the lock keeps lines whole.
        Store.append(store, Record(case=f"numerics/{tag}-{i}/ws2", family="numerics", params={}, impl=tag,
                     status=Status.PASS, message="x" * 20000, torch_version="2.13.0+cpu",
                     torch_git_version="cf30153c4c13", ranks=[RankOutcome(0, RankStatus.PASS)]))
""")


def test_concurrent_writer_processes_never_interleave_lines(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    n, tags = 150, ["w0", "w1", "w2", "w3"]
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path / "s"), tag, str(n)]) for tag in tags]
    assert [p.wait(timeout=300) for p in procs] == [0] * len(tags)
    [path] = (tmp_path / "s").glob("*.jsonl")
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b""
    parsed = [json.loads(line) for line in lines[:-1]]  # every line is whole JSON
    assert len(parsed) == n * len(tags)
    for tag in tags:
        mine = [d["case"] for d in parsed if d["impl"] == tag]
        assert mine == [f"numerics/{tag}-{i}/ws2" for i in range(n)], "a writer's records are lost or reordered"


@pytest.mark.slow(13)
def test_two_runs_into_one_store_at_once(tmp_path):
    env = harness_env(tmp_path)
    cases = small_selection(4)
    store = tmp_path / "store"
    procs = [subprocess.Popen([sys.executable, "-m", "harness", "run", "--impl", "reference", "--store", str(store),
                               "--format", "json", *[a for c in half for a in ("--case", c)]],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for half in (cases[:2], cases[2:])]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    path = store / f"{this_build_key()}.jsonl"
    lines = path.read_text().splitlines()
    assert len(lines) == 4 and sorted(json.loads(line)["case"] for line in lines) == sorted(cases)


# --- the run command: kill, resume, refusal ---------------------------------------------------------------------

@pytest.mark.slow(20)
def test_sigkill_midway_then_resume_loses_nothing_and_reruns_nothing(tmp_path):
    cases = small_selection(6)
    # TMPDIR: the SIGKILLed harness cannot remove multiprocessing's folder (pymp-*): let it be the test's.
    env = harness_env(tmp_path, SYNCBN_TEST_SLEEP="1.0", TMPDIR=str(tmp_path))
    store = tmp_path / "store"
    path = store / f"{this_build_key()}.jsonl"
    args = ["run", "--impl", "tsplug:Slow", "--store", str(store), *[a for c in cases for a in ("--case", c)]]

    def stored() -> list[dict]:
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]

    log = tmp_path / "killed-run.err"
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "harness", *args], env=env, stdout=subprocess.DEVNULL,
                                stderr=err, start_new_session=True)
    try:
        assert wait_until(lambda: len(stored()) >= 2, timeout=300), log.read_text()[-2000:]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    time.sleep(0.5)
    before = read_file(path)  # a torn tail, if the kill left one, is dropped here
    assert 2 <= len(before) < len(cases), "the kill came too late to test resuming"
    started = {r.case: r.started_at for r in before}

    env["SYNCBN_TEST_SLEEP"] = "0"
    resumed = run_cmd([*args, "--resume", "--format", "json"], env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resume: {len(before)} of {len(cases)} (case, impl) results already in" in resumed.stderr
    # The output covers the whole selection: what was stored before the kill, and what ran now.
    output = {d["case"]: d["started_at"] for d in json.loads(resumed.stdout)}
    assert sorted(output) == sorted(cases)
    assert {c: s for c, s in output.items() if c in started} == started, "resume re-ran stored cases"

    after = read_file(path)
    assert sorted(r.case for r in after) == sorted(cases), "lost or duplicated records"
    assert {r.case: r.started_at for r in after if r.case in started} == started, "stored records were rewritten"
    assert all(r.status == Status.PASS for r in after)

    again = run_cmd([*args, "--resume"], env)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "nothing left to run" in again.stderr
    assert f"{len(cases)} records: {len(cases)} pass" in again.stdout  # the summary of the whole selection
    assert len(read_file(path)) == len(cases)


def test_run_refuses_a_store_file_of_a_newer_schema_and_leaves_it_untouched(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    path = store / f"{this_build_key()}.jsonl"
    newer = dict(make_record().to_dict(), schema_version=SCHEMA_VERSION + 1, harness_version="0.9.0")
    content = json.dumps(newer) + "\n"
    path.write_text(content)
    for extra in ([], ["--resume"]):
        proc = run_cmd(["run", "--impl", "reference", "--case", small_selection(1)[0], "--store", str(store),
                        *extra], dict(os.environ))
        assert proc.returncode == 3, proc.stderr[-2000:]
        assert "upgrade syncbn-harness to 0.9.0" in proc.stderr and str(path) in proc.stderr
        assert path.read_text() == content


def test_a_file_of_no_records_says_what_it_should_have_been(tmp_path):
    garbage = tmp_path / "baseline.json"
    garbage.write_text("this is a CI log, not results\nline two\n")
    expected = (r"is not a run's JSON output \(`syncbn-harness run --format json`\) or a store \.jsonl file: line 1 "
                r"is b'this is a CI log")
    with pytest.raises(reader_mod.NotAResultsFile, match=expected):
        read_file(garbage)


def test_a_torn_line_is_reported_once_however_often_the_file_is_read(tmp_path, caplog):
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(make_record().to_dict()) + "\n" + '{"case": "numer')
    with caplog.at_level(logging.WARNING):
        for _ in range(4):
            assert len(read_file(path)) == 1
    assert caplog.text.count("dropping torn last line") == 1
