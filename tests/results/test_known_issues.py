"""The known-issues file: entries matched by impl, case pattern, torch version, status and symptoms."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from harness.errors import UsageError
from harness.results import known_issues
from harness.judge.metric import Metric
from harness.judge.mode import Mode
from harness.judge.status import RankOutcome, RankStatus, Status
from harness.results.records import Record
from harness.results.symptoms import failures

ENTRY = ('[[issue]]\nimpl = "torch"\ncases = ["mixed-precision/empty-rank/*"]\ntorch = ">=1.12,<3"\n'
         'status = "crash"\nsymptoms = ["crash SIGABRT"]\nlink = "https://example.invalid/1"\n'
         'note = """one\nline"""\n')


def _record(impl, case, status, torch_version="2.13.0+cpu", device="cpu"):
    ranks = [RankOutcome(0, RankStatus.CRASH, signal="SIGABRT"), RankOutcome(1, RankStatus.PEER_FAILED)] \
        if status == "crash" else []
    return Record(case=case, family=case.split("/")[0], params={}, impl=impl, status=Status(status),
                  torch_version=torch_version, device=device, ranks=ranks)


@pytest.fixture
def entries(tmp_path):
    f = tmp_path / "k.toml"
    f.write_text(ENTRY)
    return str(f)


def test_the_expected_failure_is_known_and_fails_nothing(entries):
    r = known_issues.annotate(_record("torch", "mixed-precision/empty-rank/x/ws2", "crash"), entries)
    assert r.known and r.known_issue.matched and not r.failed
    assert r.label == "crash (known)" and r.known_issue.link == "https://example.invalid/1"
    assert r.known_issue.note == "one line"


def test_another_failure_is_a_real_one(entries):
    r = known_issues.annotate(_record("torch", "mixed-precision/empty-rank/x/ws2", "mismatch"), entries)
    assert r.known_issue is not None and not r.known and r.failed and r.label == "mismatch"


def test_a_record_is_known_only_when_the_entry_names_every_failure(tmp_path):
    """A second defect on a case that fails as known is a real failure, and says what it is."""
    f = tmp_path / "k.toml"
    f.write_text(ENTRY.replace('status = "crash"\nsymptoms = ["crash SIGABRT"]',
                               'status = "mismatch"\nsymptoms = ["mismatch step*.train.running_*"]'))
    known = _record("torch", "mixed-precision/empty-rank/x/ws2", "mismatch")
    known.metrics = {"rank0.step1.train.running_var": Metric(2.0, 1.0, 0.1, 20.0),
                     "rank1.step1.train.running_var": Metric(2.0, 1.0, 0.1, 20.0),
                     "rank0.step1.train.output": Metric(0.0, 0.0, 0.1, 0.0)}
    assert failures(known) == ("mismatch step1.train.running_var",)  # the same tensor on two ranks is one
    assert known_issues.annotate(known, str(f)).known
    second = _record("torch", "mixed-precision/empty-rank/x/ws2", "mismatch")
    second.message = "rank 0: mismatch (...)"
    second.metrics = {**known.metrics, "rank0.step1.train.grad_input": Metric(5.0, 1.0, 0.1, 50.0),
                      "rank0.convert.00": Metric.failure("heads.a: qconfig lost in conversion")}
    second = known_issues.annotate(second, str(f))
    assert not second.known and second.failed and second.label == "mismatch (beside a known issue)"
    assert second.known_issue.unexpected == ("mismatch convert.00: heads.a: qconfig lost in conversion",
                                             "mismatch step1.train.grad_input")
    assert second.message.startswith("unexpected beside a known issue: mismatch convert.00: heads.a: qconfig lost in "
                                     "conversion; mismatch step1.train.grad_input [known: https://example.invalid/1]")
    assert Record.from_dict(second.to_dict()).known_issue == second.known_issue


def test_two_entries_on_one_case_explain_it_together(tmp_path):
    f = tmp_path / "k.toml"
    f.write_text(ENTRY + ENTRY.replace('symptoms = ["crash SIGABRT"]', 'symptoms = ["error RuntimeError: *"]')
                 .replace("example.invalid/1", "example.invalid/2").replace('status = "crash"',
                                                                           'status = ["crash", "error"]'))
    r = _record("torch", "mixed-precision/empty-rank/x/ws2", "crash")
    r.ranks[1] = RankOutcome(1, RankStatus.ERROR, exception_type="RuntimeError", message="boom\ntraceback")
    assert failures(r) == ("crash SIGABRT", "error RuntimeError: boom")  # in rank order
    r = known_issues.annotate(r, str(f))
    assert r.known and r.known_issue.link == "https://example.invalid/1"


def test_a_planted_second_defect_on_a_known_case_fails_the_run_naming_it():
    """The textbook SyncBN fails the activation-checkpoint case only as pytorch#96136 says (running statistics
    updated twice per step): known, exit 0. A copy whose gradients also go wrong exits 1, naming them."""
    from cli_here import run_here

    support = str(Path(__file__).resolve().parents[1] / "support")
    case = ["--case", "activation-checkpoint/layer/cnn/local/float32/ws2", "--format", "json"]
    env = {**__import__("os").environ, "PYTHONPATH": support}
    known = run_here(["run", "--impl", "textbook:TextbookSyncBN", *case], env=env)
    assert known.returncode == 0, known.stderr[-2000:]
    planted = run_here(["run", "--impl", "defects:NoGradThroughStats", *case], env=env)
    assert planted.returncode == 1, planted.stderr[-2000:]
    import json

    [record] = json.loads(planted.stdout)
    assert record["known_issue"]["link"].endswith("pytorch/issues/96136") and not record["known_issue"]["matched"]
    assert "mismatch step0.train.grad_input" in record["known_issue"]["unexpected"]
    assert record["message"].startswith("unexpected beside a known issue: mismatch step0.train.grad.bn1.bias")
    assert "[known: https://github.com/pytorch/pytorch/issues/96136]" in record["message"]


def test_a_pass_is_reported_as_possibly_fixed(entries):
    r = known_issues.annotate(_record("torch", "mixed-precision/empty-rank/x/ws2", "pass"), entries)
    assert r.known_issue.now_passes and not r.failed and r.label == "pass (known issue fixed?)"


@pytest.mark.parametrize("impl,case,version", [("torch", "mixed-precision/empty-rank/x/ws2", "1.11.0"),
                                               ("torch", "mixed-precision/empty-rank/x/ws2", "3.0.0"),
                                               ("reference", "mixed-precision/empty-rank/x/ws2", "2.13.0"),
                                               ("torch", "mixed-precision/uneven/x/ws2", "2.13.0")])
def test_other_impls_cases_and_versions_are_not_covered(entries, impl, case, version):
    r = known_issues.annotate(_record(impl, case, "crash", version), entries)
    assert r.known_issue is None and r.failed


def test_an_entry_for_one_device_covers_only_that_devices_records(tmp_path):
    f = tmp_path / "k.toml"
    f.write_text(ENTRY.replace('status = "crash"', 'status = "crash"\ndevice = "cuda"'))
    on_cuda = known_issues.annotate(_record("torch", "mixed-precision/empty-rank/x/ws2", "crash", device="cuda"),
                                    str(f))
    on_cpu = known_issues.annotate(_record("torch", "mixed-precision/empty-rank/x/ws2", "pass"), str(f))
    assert on_cuda.known and on_cpu.known_issue is None and on_cpu.label == "pass"


def test_an_entry_for_one_mode_covers_only_records_of_that_mode(tmp_path):
    f = tmp_path / "k.toml"
    f.write_text(ENTRY.replace('status = "crash"', 'status = "crash"\nmode = "python-fallback"'))
    fallback = _record("torch", "mixed-precision/empty-rank/x/ws2", "crash")
    fallback.mode, fallback.mode_notes = Mode.PYTHON_FALLBACK, ("nvtx no-op",)  # a note never matters
    optimized = _record("torch", "mixed-precision/empty-rank/x/ws2", "pass")
    optimized.mode = Mode.OPTIMIZED
    assert known_issues.annotate(fallback, str(f)).known
    assert known_issues.annotate(optimized, str(f)).known_issue is None


def test_an_entry_naming_no_mode_of_the_harness_is_refused_naming_the_modes(tmp_path):
    f = tmp_path / "k.toml"
    f.write_text(ENTRY.replace('status = "crash"', 'status = "crash"\nmode = "python"'))
    with pytest.raises(UsageError, match="mode = 'python': give one of 'native', 'cpu-emulation'"):
        known_issues.load(str(f))


def test_a_record_round_trips_with_its_match(entries):
    r = known_issues.annotate(_record("torch", "mixed-precision/empty-rank/x/ws2", "crash"), entries)
    again = Record.from_dict(r.to_dict())
    assert again.known_issue == r.known_issue and again.known


def test_bad_known_issues_file_names_the_problem(tmp_path):
    f = tmp_path / "k.toml"
    f.write_text('[[issue]]\nimpl = "torch"\ncases = ["*"]\ntorch = "newest"\nstatus = "crash"\nlink = "x"\n'
                 'symptoms = "crash *"\n')
    with pytest.raises(UsageError, match="'newest' is not a version specifier"):
        known_issues.load(str(f))
    f.write_text('[[issue]]\nimpl = "torch"\ncases = ["*"]\ntorch = ">1"\nstatus = "boom"\nlink = "x"\n'
                 'symptoms = "crash *"\n')
    with pytest.raises(UsageError, match="status 'boom' is not one of pass, mismatch"):
        known_issues.load(str(f))
    f.write_text(ENTRY.replace('status = "crash"', 'status = "crash"\ndevice = "gpu"'))
    with pytest.raises(UsageError, match="device = 'gpu': give \"cpu\" or \"cuda\""):
        known_issues.load(str(f))
    f.write_text('[[issue]]\nimpl = "torch"\n')
    with pytest.raises(UsageError, match="issue #1 lacks cases, torch, status, link, symptoms"):
        known_issues.load(str(f))
    f.write_text(ENTRY.replace('symptoms = ["crash SIGABRT"]', 'symptoms = ["SIGABRT"]'))
    with pytest.raises(UsageError, match="'SIGABRT' does not start with one of mismatch, error, crash, hang"):
        known_issues.load(str(f))


@pytest.mark.sweep(30)
def test_shipped_known_issues_file_is_valid_and_every_pattern_names_a_case():
    from harness import catalog

    ids = [c.id for c in catalog.all_cases()]
    entries = known_issues.load()
    assert entries
    import fnmatch

    root = Path(__file__).resolve().parents[2]
    for e in entries:
        # upstream, or (this harness's own open defects) the evidence in this repository
        assert (e.link.startswith("https://") or (root / e.link).is_file()) and e.note, e.link
        assert e.symptoms
        for pattern in e.cases:
            if pattern.startswith("search/") and not any(fnmatch.fnmatchcase(i, pattern) for i in ids):
                # A pattern over generated cases: search must draw one it names.
                drawn = _drawn("system" if pattern.startswith("search/system/") else "layer")
                assert any(fnmatch.fnmatchcase(i, pattern) for i in drawn), \
                    f"{pattern} matches none of {len(drawn)} cases search drew"
                continue
            assert any(fnmatch.fnmatchcase(i, pattern) for i in ids), f"{pattern} matches no case"


# How many cases of each kind the check draws. The rarest patterns shipped: a sliced float16 view of under 10
# channels (8 of the 4000 layer cases drawn), a conversion of a model without running statistics (34 of 4000
# training-system cases, 5 of the 1000 drawn here).
DRAWS = {"layer": 4000, "system": 1000}


@functools.lru_cache(maxsize=None)
def _drawn(kind: str) -> tuple:
    """The IDs of the :data:`DRAWS` cases of ``kind`` search draws (layer cases, or every training system, join
    included, as search draws it when named), from a fixed seed: the same sample on every run."""
    from hypothesis import HealthCheck, Phase, given, seed, settings

    from harness.search import space, systems

    ids = []

    @seed(0)
    @settings(max_examples=DRAWS[kind], database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(systems.strategy(systems.SYSTEMS) if kind == "system" else space.strategy())
    def draw(case):
        ids.append(case.id)

    draw()
    return tuple(ids)
