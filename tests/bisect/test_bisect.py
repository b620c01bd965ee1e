"""Bisection: the pure state machine with scripted verdicts, then a real bisect over virtual environments.

The end-to-end test builds eight wheels of a small package ``syncbnplug`` (a
SyncBatchNorm in plain torch over ``torch.distributed.nn.functional.all_reduce``;
a biased running variance from version 5 on, version 6 does not import), and
bisects them in real virtual environments that inherit this interpreter's
torch. A second bisection over the same range must reuse everything.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.bisect.bisector import Bisector, Outcome, Verdict, run
from harness.bisect.builds import IndexOptions
from harness.bisect.driver import bisect_builds
from harness.selection import Selection

G, B, S = Verdict.GOOD, Verdict.BAD, Verdict.SKIP


def scripted(n: int, truth: dict[int, Verdict]):
    """Bisect ``n`` builds whose verdicts are ``truth`` (default: good before 5, bad from 5)."""
    asked = []

    def evaluate(i):
        asked.append(i)
        return truth[i]

    return run(Bisector(n), evaluate), asked


def line(n, first_bad, skips=()):
    return {i: (S if i in skips else (B if i >= first_bad else G)) for i in range(n)}


# ---------------------------------------------------------------------- the state machine


def test_ends_are_checked_first_then_the_middle():
    res, asked = scripted(8, line(8, 5))
    assert asked[:2] == [0, 7]
    assert res.outcome is Outcome.FOUND
    assert (res.last_good, res.first_bad) == (4, 5)
    assert len(asked) <= 2 + 3  # log2(8) questions after the ends


@pytest.mark.parametrize("first_bad", range(1, 16))
def test_every_first_bad_position_is_found(first_bad):
    res, asked = scripted(16, line(16, first_bad))
    assert res.outcome is Outcome.FOUND
    assert (res.last_good, res.first_bad) == (first_bad - 1, first_bad)
    assert len(asked) == len(set(asked)), "a build was asked twice"
    assert len(asked) <= 2 + 4


def test_a_skip_moves_to_a_neighbour_and_still_lands():
    res, asked = scripted(8, line(8, 5, skips={3, 4}))
    assert res.outcome is Outcome.AMBIGUOUS and res.candidates == [3, 4, 5] and res.first_bad == 5
    res, asked = scripted(8, line(8, 5, skips={3}))
    assert 3 in asked and res.outcome is Outcome.FOUND and res.first_bad == 5
    # After the skip of 3, the next question is a neighbour of the midpoint, not the midpoint again.
    assert asked[asked.index(3) + 1] in (2, 4)


def test_skipped_builds_next_to_the_boundary_make_it_ambiguous():
    res, _ = scripted(8, line(8, 5, skips={4}))
    assert res.outcome is Outcome.AMBIGUOUS
    assert res.last_good == 3 and res.first_bad == 5
    assert res.candidates == [4, 5] and res.skipped == [4]


def test_all_skipped_in_the_middle():
    res, asked = scripted(6, {0: G, 1: S, 2: S, 3: S, 4: S, 5: B})
    assert sorted(asked) == [0, 1, 2, 3, 4, 5]
    assert res.outcome is Outcome.AMBIGUOUS
    assert (res.last_good, res.first_bad) == (0, 5)
    assert res.candidates == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("verdict", [B, S])
def test_good_end_not_good_stops_before_anything_else(verdict):
    res, asked = scripted(8, {0: verdict, **{i: B for i in range(1, 8)}})
    assert asked == [0]
    assert res.outcome is Outcome.GOOD_END_NOT_GOOD and res.end_verdict is verdict


@pytest.mark.parametrize("verdict", [G, S])
def test_bad_end_not_bad_stops(verdict):
    res, asked = scripted(8, {**{i: G for i in range(7)}, 7: verdict})
    assert asked == [0, 7]
    assert res.outcome is Outcome.BAD_END_NOT_BAD and res.end_verdict is verdict


def test_both_ends_wrong_stops_at_the_good_end():
    res, asked = scripted(8, {0: B, **{i: G for i in range(1, 8)}})
    assert asked == [0] and res.outcome is Outcome.GOOD_END_NOT_GOOD
    assert res.first_bad is None and res.last_good is None


def test_two_builds_need_no_middle():
    res, asked = scripted(2, {0: G, 1: B})
    assert asked == [0, 1] and res.outcome is Outcome.FOUND and (res.last_good, res.first_bad) == (0, 1)


def test_cached_verdicts_fed_up_front_are_never_asked_again():
    b = Bisector(8)
    for i, v in {0: G, 7: B, 3: G}.items():
        b.feed(i, v)
    assert b.next_index() == 5


def test_inconsistent_verdicts_are_refused():
    b = Bisector(8)
    b.feed(0, G)
    b.feed(7, B)
    b.feed(3, B)
    with pytest.raises(ValueError, match="not in order"):
        b.feed(5, G)


def test_exit_codes_read_like_git_bisect_run():
    assert [Verdict.from_exit_code(c) for c in (0, 1, 2, 125, 127, 128, 139, -11)] == [G, B, B, S, B, S, S, S]


def test_fewer_than_two_builds_is_refused():
    with pytest.raises(ValueError, match="at least 2"):
        Bisector(1)


# ---------------------------------------------------------------------- specs and the build list


def test_specs_read_as_releases_wheels_and_interpreters(tmp_path):
    from harness.bisect.builds import parse_spec

    assert parse_spec("torch==2.1.2").to_dict() == {"kind": "release", "label": "torch==2.1.2", "package": "torch",
                                                   "version": "2.1.2", "path": None}
    assert parse_spec("2.1.2", package="torch").label == "torch==2.1.2"
    wheel = tmp_path / "syncbnplug-3-py3-none-any.whl"
    wheel.write_bytes(b"")
    w = parse_spec(str(wheel))
    assert (w.kind, w.package, w.version) == ("wheel", "syncbnplug", "3")
    assert parse_spec(sys.executable).kind == "python"
    from harness.errors import UsageError

    with pytest.raises(UsageError, match="does not exist"):
        parse_spec(str(tmp_path / "missing-1-py3-none-any.whl"))
    with pytest.raises(UsageError, match="cannot read build 'banana'"):
        parse_spec("banana")


def test_release_range_orders_versions_dedupes_local_builds_and_reverses():
    from harness.bisect.builds import ordered_builds

    versions = ["2.2.0", "2.0.1", "2.13.0+cpu", "2.13.0", "1.13.1", "2.1.2", "2.14.1"]
    labels = [b.label for b in ordered_builds("torch==2.0.1", "torch==2.13.0", versions=versions)]
    assert labels == ["torch==2.0.1", "torch==2.1.2", "torch==2.2.0", "torch==2.13.0"]
    # Looking for the fix: good is the newer end, the list runs backwards.
    labels = [b.label for b in ordered_builds("torch==2.14.1", "torch==2.2.0", versions=versions)]
    assert labels == ["torch==2.14.1", "torch==2.13.0", "torch==2.2.0"]


def test_builds_file_gives_the_order_and_must_hold_both_ends(tmp_path):
    from harness.bisect.builds import ordered_builds
    from harness.errors import UsageError

    f = tmp_path / "builds.txt"
    f.write_text(f"# oldest first\ntorch==2.0.1\n{sys.executable}  # the dev build\ntorch==2.13.0\n")
    got = ordered_builds("torch==2.0.1", "torch==2.13.0", builds_file=str(f))
    assert [b.kind for b in got] == ["release", "python", "release"]
    with pytest.raises(UsageError, match="not in --builds"):
        ordered_builds("torch==1.13.1", "torch==2.13.0", builds_file=str(f))


def test_verdict_follows_check_rule():
    from harness.bisect.verdicts import verdict_of
    from harness.results.records import Record

    rec = {"case": "c", "family": "f", "params": {}, "impl": "i", "status": "pass"}
    assert verdict_of([Record.from_dict(rec)])[0] is G
    assert verdict_of([Record.from_dict(rec), Record.from_dict({**rec, "status": "hang"})])[0] is B
    assert verdict_of([Record.from_dict({**rec, "status": "skipped", "message": "apex absent"})])[0] is S
    assert verdict_of([])[0] is S


# ---------------------------------------------------------------------- real environments

from syncbnplug_template import PLUGIN  # noqa: E402  (shared with test_bisect_script and test_repro)

CASE = "allgather-shape/uneven-2-6/float64-float64/contiguous/ws2"
SELECTION = Selection(impls=("syncbnplug:SyncBatchNorm",), case_patterns=(CASE,), device="cpu", timeout=60)


def build_wheels(dest: Path, versions=range(1, 9), defect_from=5, broken=(6,), uninstallable=()) -> Path:
    """Wheels ``syncbnplug-V`` built with setuptools from real source trees.

    ``broken``: releases that install but do not import; ``uninstallable``: releases that depend on a
    package no index has, so pip cannot install them.
    """
    wheels = dest / "wheels"
    wheels.mkdir(parents=True)
    for v in versions:
        src = dest / f"src{v}"
        (src / "syncbnplug").mkdir(parents=True)
        (src / "pyproject.toml").write_text(textwrap.dedent(f'''
            [build-system]
            requires = ["setuptools>=61"]
            build-backend = "setuptools.build_meta"
            [project]
            name = "syncbnplug"
            version = "{v}"
            dependencies = {'["syncbnplug-no-such-dependency>=1"]' if v in uninstallable else "[]"}
            [tool.setuptools]
            packages = ["syncbnplug"]
        '''))
        (src / "syncbnplug" / "__init__.py").write_text(PLUGIN.format(
            version=v, biased=v >= defect_from,
            broken="import syncbnplug_missing_dependency  # this release does not import" if v in broken else ""))
    # setuptools' PEP 517 backend, one process per source tree (pip wheel refuses several versions of
    # one project in one call, and one backend process cannot build twice), all at once.
    code = "import sys; from setuptools import build_meta; build_meta.build_wheel(sys.argv[1])"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(wheels)], cwd=dest / f"src{v}",
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for v in versions]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()
    assert len(list(wheels.glob("*.whl"))) == len(list(versions))
    return wheels


@pytest.mark.sweep(20)
@pytest.mark.slow
def test_bisect_over_real_environments_lands_on_the_defect_and_reuses_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SYNCBN_HARNESS_CACHE", str(tmp_path / "cache"))
    wheels = build_wheels(tmp_path)
    kw = dict(good="syncbnplug==1", bad="syncbnplug==8", package="syncbnplug",
              index=IndexOptions(find_links=(str(wheels),), no_index=True), selection=SELECTION)
    t0 = time.monotonic()
    first = bisect_builds(**kw)
    t_first = time.monotonic() - t0
    assert first.result.outcome is Outcome.FOUND, first.summary()
    assert first.builds[first.result.first_bad].label == "syncbnplug==5"
    assert first.builds[first.result.last_good].label == "syncbnplug==4"
    assert "syncbnplug==6" in [first.builds[i].label for i in first.result.skipped]
    assert first.stats["envs_created"] == first.stats["evaluated"] >= 4
    # The records that differ: the case passes on 4 and is a mismatch on 5, in the running variance.
    diff = first.differing_records()
    assert [(d["case"], d["good"]["status"], d["bad"]["status"]) for d in diff] == [(CASE, "pass", "mismatch")]
    assert "running_var" in diff[0]["bad"]["message"]
    text = first.summary()
    assert "first bad: syncbnplug==5" in text and "last good: syncbnplug==4" in text

    t0 = time.monotonic()
    second = bisect_builds(**kw)
    t_second = time.monotonic() - t0
    assert second.builds[second.result.first_bad].label == "syncbnplug==5"
    assert second.stats["envs_created"] == 0 and second.stats["evaluated"] == 0
    assert second.stats["cached"] == first.stats["evaluated"]
    assert t_second < t_first / 5, (t_first, t_second)


@pytest.mark.slow(17)
def test_bisect_command_stops_when_the_good_end_is_bad(tmp_path):
    wheels = build_wheels(tmp_path, versions=[1, 2, 3], defect_from=1, broken=())
    env = {"SYNCBN_HARNESS_CACHE": str(tmp_path / "cache")}
    import os

    proc = subprocess.run(
        [sys.executable, "-m", "harness", "bisect", "--good", "syncbnplug==1", "--bad", "syncbnplug==3",
         "--package", "syncbnplug", "--find-links", str(wheels), "--no-index",
         "--impl", "syncbnplug:SyncBatchNorm", "--case", CASE, "--device", "cpu", "--format", "json"],
        capture_output=True, text=True, timeout=600, env={**os.environ, **env})
    assert proc.returncode == 1, proc.stderr
    assert "good end syncbnplug==1 is not good (bad)" in proc.stderr
    out = json.loads(proc.stdout)
    assert out["result"]["outcome"] == "good-end-not-good"
    assert [b["label"] for b in out["builds"] if b["verdict"]] == ["syncbnplug==1"]


@pytest.mark.slow(22)
def test_a_build_that_fails_to_install_is_skipped_not_fatal(tmp_path, monkeypatch):
    monkeypatch.setenv("SYNCBN_HARNESS_CACHE", str(tmp_path / "cache"))
    wheels = build_wheels(tmp_path, versions=[1, 2, 3], defect_from=3, broken=(), uninstallable=(2,))
    bisection = bisect_builds(good="syncbnplug==1", bad="syncbnplug==3", package="syncbnplug", selection=SELECTION,
                        index=IndexOptions(find_links=(str(wheels),), no_index=True))
    verdicts = {bisection.builds[i].label: ev.verdict.value for i, ev in bisection.evaluations.items()}
    assert verdicts == {"syncbnplug==1": "good", "syncbnplug==2": "skip", "syncbnplug==3": "bad"}
    reason = bisection.evaluations[1].reason
    assert "install failed" in reason and "syncbnplug-no-such-dependency" in reason
    # The answer says what it can: the first bad build is 2 (untestable) or 3.
    assert bisection.result.outcome is Outcome.AMBIGUOUS
    assert [bisection.builds[i].label for i in bisection.result.candidates] == ["syncbnplug==2", "syncbnplug==3"]
    assert "could not be tested" in bisection.summary()


@pytest.mark.slow(17)
def test_bisect_between_two_wheel_files(tmp_path, monkeypatch):
    monkeypatch.setenv("SYNCBN_HARNESS_CACHE", str(tmp_path / "cache"))
    wheels = build_wheels(tmp_path, versions=[4, 5], defect_from=5, broken=())
    bisection = bisect_builds(good=str(wheels / "syncbnplug-4-py3-none-any.whl"),
                        bad=str(wheels / "syncbnplug-5-py3-none-any.whl"), selection=SELECTION)
    assert bisection.result.outcome is Outcome.FOUND and [b.kind for b in bisection.builds] == ["wheel", "wheel"]
    assert bisection.differing_records()[0]["bad"]["status"] == "mismatch"
