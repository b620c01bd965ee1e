"""The known-issues file: entries matched by impl, case pattern, torch version and status."""

from __future__ import annotations

import functools

import pytest

from harness.errors import UsageError
from harness.results import known_issues
from harness.results.records import Record, Status

ENTRY = ('[[issue]]\nimpl = "torch"\ncases = ["mixed-precision/empty-rank/*"]\ntorch = ">=1.12,<3"\n'
         'status = "crash"\nlink = "https://example.invalid/1"\nnote = """one\nline"""\n')


def _record(impl, case, status, torch_version="2.13.0+cpu", device="cpu"):
    return Record(case=case, family=case.split("/")[0], params={}, impl=impl, status=Status(status),
                  torch_version=torch_version, device=device)


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
    fallback.mode = "python-fallback (nvtx no-op)"
    optimized = _record("torch", "mixed-precision/empty-rank/x/ws2", "pass")
    optimized.mode = "optimized"
    assert known_issues.annotate(fallback, str(f)).known
    assert known_issues.annotate(optimized, str(f)).known_issue is None


def test_a_record_round_trips_with_its_match(entries):
    r = known_issues.annotate(_record("torch", "mixed-precision/empty-rank/x/ws2", "crash"), entries)
    again = Record.from_dict(r.to_dict())
    assert again.known_issue == r.known_issue and again.known


def test_bad_known_issues_file_names_the_problem(tmp_path):
    f = tmp_path / "k.toml"
    f.write_text('[[issue]]\nimpl = "torch"\ncases = ["*"]\ntorch = "newest"\nstatus = "crash"\nlink = "x"\n')
    with pytest.raises(UsageError, match="'newest' is not a version specifier"):
        known_issues.load(str(f))
    f.write_text('[[issue]]\nimpl = "torch"\ncases = ["*"]\ntorch = ">1"\nstatus = "boom"\nlink = "x"\n')
    with pytest.raises(UsageError, match="status 'boom' is not one of pass, mismatch"):
        known_issues.load(str(f))
    f.write_text(ENTRY.replace('status = "crash"', 'status = "crash"\ndevice = "gpu"'))
    with pytest.raises(UsageError, match="device = 'gpu': give \"cpu\" or \"cuda\""):
        known_issues.load(str(f))
    f.write_text('[[issue]]\nimpl = "torch"\n')
    with pytest.raises(UsageError, match="issue #1 lacks cases, torch, status, link"):
        known_issues.load(str(f))


@pytest.mark.sweep(30)
def test_shipped_known_issues_file_is_valid_and_every_pattern_names_a_case():
    from harness import catalog

    ids = [c.id for c in catalog.all_cases()]
    entries = known_issues.load()
    assert entries
    import fnmatch

    for e in entries:
        assert e.link.startswith("https://") and e.note
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
