"""Nightlies by date: day specs, one nightly per day, missing days skipped, and a real date bisection.

The end-to-end test builds ``syncbnplug==1.0.devYYYYMMDD`` wheels for 2026-10-01..08 with no
wheel for 2026-10-04 (a nightly that failed or expired), a biased running variance from
2026-10-06 on, and in each a ``syncbnplug/version.py`` whose ``git_version`` is that day's
commit on the ``nightly`` branch of a pytorch-shaped repository (made with git in tmp_path). The
bisection over a find-links folder must skip the missing day, land between 10-05 and 10-06, name
their commits, and, given the repository, the main commits between them that touch SyncBN's files.
"""

from __future__ import annotations

import datetime
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.bisect.bisector import Outcome, Verdict
from harness.bisect.builds import IndexOptions
from harness.bisect.nightly import bisect_nightlies, git_version, is_nightly_spec, nightly_range
from harness.bisect.verdicts import Evaluation
from harness.errors import UsageError
from harness.selection import Selection
from pytorch_repo import PytorchRepo
from syncbnplug_template import PLUGIN

CASE = "allgather-shape/uneven-2-6/float64-float64/contiguous/ws2"
SELECTION = Selection(impls=("syncbnplug:SyncBatchNorm",), case_patterns=(CASE,), device="cpu", timeout=60)
TORCH = ["2.13.0.dev20261001+cpu", "2.13.0.dev20261002+cpu", "2.12.0.dev20261002+cpu", "2.13.0.dev20261005+cpu",
         "2.12.0", "2.13.0.dev20261008+cpu"]


# ---------------------------------------------------------------------- specs and the range


def test_days_and_dev_versions_are_nightly_specs_releases_are_not():
    assert is_nightly_spec("2026-10-01") and is_nightly_spec("2.13.0.dev20261001")
    assert is_nightly_spec("torch==2.13.0.dev20261001+cpu") and is_nightly_spec("syncbnplug==1.0.dev20261001")
    assert not is_nightly_spec("torch==2.13.0") and not is_nightly_spec("/usr/bin/python3")


def test_one_nightly_per_day_missing_days_listed_ends_moved_inward():
    r = nightly_range("2026-09-30", "2026-10-07", TORCH)
    # The highest version of a day (main's 2.13 over the 2.12 branch's), releases ignored.
    assert [b.label for b in r.builds] == ["torch==2.13.0.dev20261001+cpu", "torch==2.13.0.dev20261002+cpu",
                                           "torch==2.13.0.dev20261005+cpu"]
    assert r.missing == [datetime.date(2026, 10, 3), datetime.date(2026, 10, 4)]
    assert r.notes == ["no nightly of torch on 2026-09-30: the good end is 2026-10-01's "
                       "(torch==2.13.0.dev20261001+cpu)",
                       "no nightly of torch on 2026-10-07: the bad end is 2026-10-05's (torch==2.13.0.dev20261005+cpu)"]


def test_a_newer_good_end_runs_backwards_and_a_version_end_is_that_days_nightly():
    r = nightly_range("torch==2.13.0.dev20261008+cpu", "2.13.0.dev20261002+cpu", TORCH)
    assert [b.version for b in r.builds] == ["2.13.0.dev20261008+cpu", "2.13.0.dev20261005+cpu",
                                             "2.13.0.dev20261002+cpu"]
    assert r.days[0] > r.days[-1] and r.notes == []


def test_ranges_without_two_nightlies_and_bad_specs_are_usage_errors():
    with pytest.raises(UsageError, match=r"has 1 nightly of torch from 2026-10-03 to 2026-10-05.*2026-10-02"):
        nightly_range("2026-10-03", "2026-10-05", TORCH)
    with pytest.raises(UsageError, match="not a day of the calendar"):
        nightly_range("2026-02-30", "2026-10-05", TORCH)
    with pytest.raises(UsageError, match="same day"):
        nightly_range("2026-10-01", "2.13.0.dev20261001", TORCH)
    with pytest.raises(UsageError, match="different packages"):
        nightly_range("torch==2.13.0.dev20261001", "2026-10-05", TORCH, package="torchvision")


def test_git_version_is_asked_of_the_build_and_never_made_up():
    import torch

    here = Evaluation(Verdict.GOOD, "1 passed", records=[], python=sys.executable)
    assert git_version("torch", here) == (torch.version.git_version, "torch.version.git_version")
    sha, why = git_version("syncbnplug", here)
    assert sha is None and why == "syncbnplug.version does not import (ModuleNotFoundError)"
    assert git_version("syncbnplug", None) == (None, "not tested")


def test_mixed_ends_and_stray_flags_are_refused(capsys):
    from harness.commands import load_commands, main

    load_commands()
    for args, msg in ((["--good", "2026-10-01", "--bad", "torch==2.14.1"], "needs both ends as days"),
                      (["--good", "torch==2.13.0", "--bad", "torch==2.14.1", "--base", "abc"], "--base applies only"),
                      (["--good", "a", "--bad", "b", "--overlay", ".", "--package", "x"], "--package do not apply")):
        with pytest.raises(SystemExit) as info:
            main(["bisect", *args])
        assert info.value.code == 2 and msg in capsys.readouterr().err


# ---------------------------------------------------------------------- a real date bisection

DAYS = [datetime.date(2026, 10, d) for d in range(1, 9)]
MISSING = datetime.date(2026, 10, 4)
DEFECT_FROM = datetime.date(2026, 10, 6)


def make_repo(path: Path) -> tuple[PytorchRepo, dict, dict]:
    """Main commits and one nightly-release commit a day; returns (repo, main shas by name, nightly sha by day)."""
    repo = PytorchRepo(path)
    m = {"base": repo.commit("base", {"torch/nn/modules/_functions.py": "# v0\n", "README.md": "t\n",
                                      "torch/nn/parallel/distributed.py": "# v0\n"})}
    m["docs"] = repo.commit("docs: README", {"README.md": "t\nmore\n"})
    m["bn"] = repo.commit("nn: batchnorm.py", {"torch/nn/modules/batchnorm.py": "# v1\n"})
    m["misc"] = repo.commit("misc: tools", {"tools/x.py": "# x\n"})
    m["culprit"] = repo.commit("SyncBatchNorm: running variance", {"torch/nn/modules/_functions.py": "# v1\n"})
    m["docs2"] = repo.commit("docs: more", {"README.md": "t\nmore\nstill\n"})
    m["ddp"] = repo.commit("DDP: buffers", {"torch/nn/parallel/distributed.py": "# v1\n"})
    m["later"] = repo.commit("test: later", {"test/test_nn.py": "# t\n"})
    main_of_day = {1: "base", 2: "docs", 3: "bn", 4: "bn", 5: "misc", 6: "ddp", 7: "later", 8: "later"}
    nightly = {d: repo.nightly(str(d), m[main_of_day[d.day]]) for d in DAYS}
    return repo, m, nightly


def build_nightly_wheels(dest: Path, nightly: dict) -> Path:
    wheels = dest / "wheels"
    wheels.mkdir(parents=True)
    srcs = []
    for day in DAYS:
        if day == MISSING:
            continue
        version = f"1.0.dev{day:%Y%m%d}"
        src = dest / f"src{version}"
        (src / "syncbnplug").mkdir(parents=True)
        (src / "pyproject.toml").write_text(textwrap.dedent(f'''
            [build-system]
            requires = ["setuptools>=61"]
            build-backend = "setuptools.build_meta"
            [project]
            name = "syncbnplug"
            version = "{version}"
            [tool.setuptools]
            packages = ["syncbnplug"]
        '''))
        (src / "syncbnplug" / "__init__.py").write_text(PLUGIN.format(version=version, biased=day >= DEFECT_FROM,
                                                                      broken=""))
        (src / "syncbnplug" / "version.py").write_text(f"git_version = {nightly[day]!r}\n")
        srcs.append(src)
    code = "import sys; from setuptools import build_meta; build_meta.build_wheel(sys.argv[1])"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(wheels)], cwd=src, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE) for src in srcs]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()
    return wheels


@pytest.mark.sweep(21)
@pytest.mark.slow
def test_date_bisection_skips_the_missing_day_and_names_the_commits(tmp_path, monkeypatch):
    monkeypatch.setenv("SYNCBN_HARNESS_CACHE", str(tmp_path / "cache"))
    repo, m, nightly = make_repo(tmp_path / "pytorch")
    wheels = build_nightly_wheels(tmp_path, nightly)
    got = bisect_nightlies(good="2026-10-01", bad="2026-10-08", package="syncbnplug", selection=SELECTION,
                           index=IndexOptions(find_links=(str(wheels),), no_index=True), pytorch_repo=str(repo.path))
    text = got.summary()
    run = got.run
    assert run.result.outcome is Outcome.FOUND, text
    labels = [b.label for b in run.builds]
    assert "syncbnplug==1.0.dev20261004" not in labels and len(labels) == 7
    assert (labels[run.result.last_good], labels[run.result.first_bad]) == ("syncbnplug==1.0.dev20261005",
                                                                            "syncbnplug==1.0.dev20261006")
    assert run.stats["evaluated"] == 4  # both ends, 10-05, 10-06
    assert "days without a nightly of syncbnplug (1): 2026-10-04" in text
    # What the two nightlies were built from, and the main commits between them.
    assert got.commits["last_good"] == (nightly[DAYS[4]], "syncbnplug.version.git_version")
    assert got.main.good_main == m["misc"] and got.main.bad_main == m["ddp"] and got.main.commits == 3
    assert [(c.commit, c.files) for c in got.main.touching] == [
        (m["culprit"], ["torch/nn/modules/_functions.py"]), (m["ddp"], ["torch/nn/parallel/distributed.py"])]
    assert f"compare: https://github.com/pytorch/pytorch/compare/{m['misc']}...{m['ddp']}" in text
    assert text.splitlines()[-2:] == [f"first bad commit: {nightly[DAYS[5]]}", f"last good commit: {nightly[DAYS[4]]}"]
