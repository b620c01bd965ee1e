"""Each bisect mode's answer renders itself: scripted bisections (no git, no child process) printed and dumped.

The overlay answers get a stand-in checkout (its path, and the commits ``touching`` paths) and a stand-in
overlay source (a plan per commit); everything else is the real thing: builds, results, evaluations with
records, the release bisection's body, the nightly answer around an in-day one.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from harness.bisect.answers import Answer, CommitBisection, CompiledSuspects
from harness.bisect.bisector import Outcome, Result, Verdict
from harness.bisect.builds import Build
from harness.bisect.checkout import Suspect
from harness.bisect.commits import commit_label
from harness.bisect.driver import BisectRun
from harness.bisect.nightly import BuiltFrom, MainRange, NightlyBisection, NightlyRange
from harness.bisect.overlay import Binary, OverlayPlan, OverlayPolicy, PathKind, Target, classify
from harness.bisect.verdicts import Evaluation
from harness.commands.bisect import INSIDE_DAY, NIGHTLIES, OVERLAY, RELEASES, refuse_flags
from harness.errors import UsageError
from harness.judge.status import Status
from harness.results.records import Record
from harness.selection import Selection

SHAS = [c * 40 for c in "0123456789"]
SUBJECTS = ["base", "docs", "nn: comment", "SyncBatchNorm: count per rank", "aten: Normalization.cpp", "test: more"]
CUH = "aten/src/ATen/native/cuda/Normalization.cuh"
SELECTION = Selection(impls=("torch",), case_patterns=("allgather-shape/*",), device="cpu")
BINARY = Binary("/usr/bin/python3", "/site/torch", "2.13.0+cpu", "f" * 40)
OVERLAY_STATS = {"evaluated": 3, "cached": 1, "overlays_created": 2}


class Repo:
    """A checkout as the answers ask it: its path, and which commits touch some paths."""

    path = Path("/src/pytorch")

    def __init__(self, touching: list[Suspect] = ()):
        self.found, self.asked = list(touching), []

    def touching(self, good: str, bad: str, paths) -> list[Suspect]:
        self.asked.append((good, bad, list(paths)))
        return self.found


class Source:
    """An overlay source as the answers ask it: the targets, the policy, a plan per commit."""

    stat, noun = "overlays_created", "overlays"

    def __init__(self, policy: OverlayPolicy, compiled: dict[str, list[str]] = None, on_path: dict = None):
        self.targets, self.policy = [Target(BINARY, SHAS[0])], policy
        self.compiled, self.on_path = compiled or {}, on_path or {}

    @property
    def base(self) -> str:
        return self.targets[0].base

    @property
    def binary(self) -> Binary:
        return BINARY

    def plan(self, commit: str) -> OverlayPlan:
        return OverlayPlan(commit, self.targets[0], [], self.compiled.get(commit, []), self.on_path.get(commit, []),
                           self.policy)


def builds(n: int = len(SUBJECTS)) -> list[Build]:
    return [Build("overlay", commit_label(SHAS[i], SUBJECTS[i]), package="torch", version=BINARY.version,
                  path="/src/pytorch", commit=SHAS[i]) for i in range(n)]


def evaluation(verdict: Verdict, status: Status = Status.PASS, cached: bool = False) -> Evaluation:
    record = Record("allgather-shape/x", "allgather-shape", {}, "torch", status,
                    message="running_var differs" if status is Status.MISMATCH else "")
    return Evaluation(verdict, "1 passed" if verdict is Verdict.GOOD else "1 of 1 failed", [record], cached=cached)


GOOD, BAD = evaluation(Verdict.GOOD), evaluation(Verdict.BAD, Status.MISMATCH)


def test_every_mode_answers_with_an_answer():
    run = BisectRun(builds(), Result(Outcome.FOUND, 2, 3, [3]), {0: GOOD, 5: BAD, 2: GOOD, 3: BAD}, OVERLAY_STATS)
    nightly = NightlyRange("torch", builds(2), [datetime.date(2026, 10, 1), datetime.date(2026, 10, 2)])
    answers = [run, CommitBisection(run, Repo(), Source(OverlayPolicy.PYTHON), SELECTION, {}),
               CompiledSuspects(builds(), Repo(), Source(OverlayPolicy.PYTHON), OVERLAY_STATS, "asked", [], False, 0),
               NightlyBisection(run, nightly, SELECTION)]
    assert all(isinstance(a, Answer) for a in answers)
    assert run.last_lines() == []  # a release bisection's answer is its body's "first bad: <build>"


def test_a_python_culprit_renders_its_kind_the_approximate_commits_and_its_last_lines():
    evaluations = {0: GOOD, 5: BAD, 2: GOOD, 3: BAD}
    run = BisectRun(builds(), Result(Outcome.FOUND, 2, 3, [3]), evaluations, OVERLAY_STATS,
                    created=("overlays_created", "overlays"), marks={2: "~", 3: "~"})
    source = Source(OverlayPolicy.PYTHON, compiled={SHAS[2]: [CUH], SHAS[3]: [CUH]}, on_path={SHAS[3]: [CUH]})
    answer = CommitBisection(run, Repo(), source, SELECTION, {}, {2: "approximate: a", 3: "approximate: b"},
                             asked="asked first: ... fails")
    lines = answer.summary().splitlines()
    assert lines[:6] == [f"  {b.label:<40} {m}" for b, m in zip(
        builds(), ["good", "-", "good~", "bad~  1 of 1 failed", "-", "bad   1 of 1 failed"])]
    assert lines[6:] == [
        f"first bad: {builds()[3].label}", f"last good: {builds()[2].label}", "records that differ (1):",
        "  allgather-shape/x [torch]: pass -> mismatch  running_var differs", "asked first: ... fails",
        "~ approximate: 2 tested commits left compiled files that differ from the binary out, 1 of them on "
        "SyncBN's path",
        "(3 builds tested, 1 verdicts from cache, 2 overlays created)",
        f"first bad commit (Python): {SHAS[3]}", f"last good commit: {SHAS[2]}"]
    assert answer.kind == "python" and answer.outcome is Outcome.FOUND
    d = json.loads(json.dumps(answer.to_dict()))
    assert (d["mode"], d["kind"], d["first_bad_commit"], d["last_good_commit"]) == ("overlay", "python", SHAS[3],
                                                                                     SHAS[2])
    assert [a["commit"] for a in d["approximate"]] == [SHAS[2], SHAS[3]] and d["approximate"][1]["on_path"] == [CUH]
    assert d["differing"][0]["bad"]["status"] == "mismatch" and d["builds"][3]["mark"] == "~"
    assert [c["verdict"] for c in answer.timeline()["commits"]] == ["good", None, "good", "bad", None, "bad"]


def test_untestable_commits_that_may_be_the_culprit_come_with_the_commands_that_build_them():
    evaluations = {0: GOOD, 5: BAD, 3: GOOD, 4: evaluation(Verdict.SKIP)}
    run = BisectRun(builds(), Result(Outcome.AMBIGUOUS, 3, 5, [4, 5], [4]), evaluations, OVERLAY_STATS,
                    created=("overlays_created", "overlays"))
    repo = Repo()
    answer = CommitBisection(run, repo, Source(OverlayPolicy.STRICT), SELECTION, {4: "compiled sources differ"})
    text = answer.summary()
    assert f"commits an overlay cannot test on 2.13.0+cpu (base {SHAS[0][:12]}) (1):\n  {SHAS[4]}  compiled" in text
    assert ("    syncbn-harness bisect-script --impl torch --case 'allgather-shape/*' --device cpu --build-cmd "
            "'python setup.py develop' -o /src/pytorch/bisect-step.py\n    cd /src/pytorch\n"
            f"    git bisect start {SHAS[5][:12]} {SHAS[3][:12]}\n    git bisect run ./bisect-step.py") in text
    assert not repo.asked  # no suspects named: git builds the whole range left open
    assert text.splitlines()[-2:] == [f"first bad commit: one of {SHAS[4]} {SHAS[5]}", f"last good commit: {SHAS[3]}"]
    d = answer.to_dict()
    assert d["kind"] == "strict" and d["first_bad_commit"] is None and d["first_bad_candidates"] == SHAS[4:6]


def test_a_compiled_culprit_on_the_path_is_named_with_commands_that_build_only_it():
    other = Suspect(SHAS[7], "aten: unrelated", [CUH])
    repo = Repo([Suspect(SHAS[4], SUBJECTS[4], [CUH]), other])
    answer = CompiledSuspects.of(builds(), repo, Source(OverlayPolicy.PYTHON), SELECTION, {**OVERLAY_STATS},
                                 "asked first: ... passes", [Suspect(SHAS[4], SUBJECTS[4], [f"{CUH} (an entry)"])],
                                 [Suspect(SHAS[1], SUBJECTS[1], ["c10/x.h"]), Suspect(SHAS[4], SUBJECTS[4], [CUH])])
    assert answer.summary().splitlines() == [
        "asked first: ... passes",
        "of the 2 commits in the range that change compiled files, 1 on SyncBN's path:",
        f"  {SHAS[4]}  {SUBJECTS[4]}  [{CUH} (an entry)]",
        "build only those from source, with a git bisect run step:",
        "    syncbn-harness bisect-script --impl torch --case 'allgather-shape/*' --device cpu --build-cmd "
        "'python setup.py develop' -o /src/pytorch/bisect-step.py",
        "    cd /src/pytorch", f"    git bisect start {SHAS[5][:12]} {SHAS[0][:12]} -- {CUH}",
        f"    git bisect skip {SHAS[7][:12]}", "    git bisect run ./bisect-step.py",
        "(3 builds tested, 1 verdicts from cache, 2 overlays created)",
        f"first bad commit (compiled, the only one on SyncBN's path): {SHAS[4]}", f"last good commit: {SHAS[0]}"]
    assert repo.asked == [(SHAS[0], SHAS[5], [CUH])]  # asked once, when the answer was made
    assert answer.kind == "compiled" and answer.outcome is Outcome.AMBIGUOUS
    d = json.loads(json.dumps(answer.to_dict()))
    assert (d["kind"], d["first_bad_commit"], d["first_bad_candidates"], d["last_good_commit"]) == (
        "compiled", None, [SHAS[4]], SHAS[0])
    assert d["result"]["candidates"] == [4] and d["suspects"][0]["files"] == [f"{CUH} (an entry)"]
    assert d["commands"][-1] == "git bisect run ./bisect-step.py" and len(repo.asked) == 1
    timeline = answer.timeline()
    assert timeline["kind"] == "compiled" and [c["verdict"] for c in timeline["commits"]] == [None] * 6


def test_compiled_suspects_off_the_path_or_none_at_all():
    every = [Suspect(SHAS[1], SUBJECTS[1], ["c10/x.h"]), Suspect(SHAS[4], SUBJECTS[4], ["aten/y.cpp"])]
    repo = Repo()
    answer = CompiledSuspects.of(builds(), repo, Source(OverlayPolicy.PYTHON), SELECTION, OVERLAY_STATS, "asked",
                                 [], every)
    lines = answer.summary().splitlines()
    assert lines[1] == ("none of the 2 commits in the range that change compiled files touches SyncBN's path "
                        "(widen it with --on-path); they are:")
    assert f"    git bisect start {SHAS[5][:12]} {SHAS[0][:12]} -- aten c10 torch/csrc caffe2 torchgen " \
           "tools/autograd third_party" in lines
    assert lines[-2] == f"first bad commit is one of 2 compiled commits (none on SyncBN's path): {SHAS[1]} {SHAS[4]}"

    none = CompiledSuspects.of(builds(), repo, Source(OverlayPolicy.PYTHON), SELECTION, OVERLAY_STATS, "asked",
                               [], [])
    lines = none.summary().splitlines()
    assert lines[1].startswith(f"no commit of the range changes compiled files: those that differ from the binary "
                               f"were changed between its base {SHAS[0][:12]} and the good end")
    assert lines[2:] == ["(3 builds tested, 1 verdicts from cache, 2 overlays created)",
                         "first bad commit: unknown (compiled changes before the good end are needed to fail)",
                         f"last good commit: {SHAS[0]}"]
    assert len(repo.asked) == 1 and none.to_dict()["commands"] == []


def test_a_nightly_answer_ends_with_its_in_day_answer_whichever_it_is():
    days = [datetime.date(2026, 10, 1), datetime.date(2026, 10, 2)]
    run = BisectRun([Build("release", f"torch==2.13.0.dev2026100{d}", package="torch") for d in (1, 2)],
                    Result(Outcome.FOUND, 0, 1, [1]), {0: GOOD, 1: BAD}, {"evaluated": 2, "cached": 0,
                                                                          "envs_created": 2})
    main = MainRange(SHAS[0], SHAS[5], 5, [Suspect(SHAS[3], SUBJECTS[3], ["torch/nn/modules/_functions.py"])],
                     "https://github.com/pytorch/pytorch/compare/x...y")
    inside = CompiledSuspects.of(builds(), Repo(), Source(OverlayPolicy.PYTHON), SELECTION, OVERLAY_STATS,
                                 "asked first: ... passes", [], [Suspect(SHAS[4], SUBJECTS[4], ["aten/y.cpp"])])
    commits = {"last_good": BuiltFrom("a" * 40, "torch.version.git_version"),
               "first_bad": BuiltFrom("b" * 40, "torch.version.git_version")}
    answer = NightlyBisection(run, NightlyRange("torch", run.builds, days), SELECTION, Repo(), commits, main, inside)
    text = answer.summary()
    assert text.splitlines()[-2:] == inside.last_lines()
    assert f"main commits between them: 5 ({SHAS[0][:12]}..{SHAS[5][:12]} in /src/pytorch)\n" \
           f"touching SyncBN's files (1):\n  {SHAS[3]}  {SUBJECTS[3]}  [torch/nn/modules/_functions.py]" in text
    assert "inside the day, the main commits laid over the two nightlies:\n  asked first: ... passes" in text
    d = json.loads(json.dumps(answer.to_dict()))
    assert d["inside_the_day"]["kind"] == "compiled" and d["main_range"]["touching"][0]["commit"] == SHAS[3]
    assert (d["first_bad_commit"], d["git_version_source"]["last_good"]) == ("b" * 40, "torch.version.git_version")

    unknown = NightlyBisection(run, NightlyRange("torch", run.builds, days), SELECTION, Repo(),
                               {"last_good": BuiltFrom("a" * 40, "here"), "first_bad": BuiltFrom(None, "gone")},
                               MainRange(why="the clone does not hold it"))
    assert "main commits between them: unknown (the clone does not hold it)" in unknown.summary()
    assert unknown.last_lines() == ["first bad commit: unknown (gone)", f"last good commit: {'a' * 40}"]
    assert unknown.to_dict()["main_range"] == {"why": "the clone does not hold it"}


def test_paths_sort_into_kinds_and_policies_stay_their_strings():
    assert classify("torch/nn/modules/batchnorm.py") is PathKind.PYTHON == "python"
    assert classify("aten/src/ATen/native/Normalization.cpp") is PathKind.COMPILED
    assert json.dumps([OverlayPolicy.RELEVANCE, PathKind.OTHER]) == '["relevance", "other"]'
    assert f"{OverlayPolicy.STRICT}" == "strict"


@pytest.mark.parametrize("modes, given, message", [
    ({RELEASES}, {"--strict": True}, "--strict applies only to --overlay PATH or nightlies with --pytorch-repo: "
                                     "drop it"),
    ({NIGHTLIES}, {"--on-path": ("x",)}, "--on-path applies only to --overlay PATH or nightlies with "
                                         "--pytorch-repo: drop it"),
    ({NIGHTLIES}, {"--binary": ("p=r",)}, "--binary applies only to --overlay PATH: drop it"),
    ({RELEASES}, {"--base": "r", "--pytorch-repo": "/p"}, "--base applies only to --overlay PATH: drop it"),
    ({RELEASES}, {"--pytorch-repo": "/p"}, "--pytorch-repo applies only to nightlies by day (--good 2026-10-01 "
                                           "...): drop it"),
    ({NIGHTLIES, INSIDE_DAY}, {"--builds": "f"}, "--builds applies only to releases, wheels or interpreters: "
                                                 "drop it"),
    ({OVERLAY}, {"--package": "x", "--pytorch-repo": "/p", "--strict": True},
     "--overlay bisects commits of a checkout: --package, --pytorch-repo do not apply; drop them"),
])
def test_a_flag_out_of_its_mode_is_refused_with_the_fix(modes, given, message):
    with pytest.raises(UsageError) as info:
        refuse_flags(modes, given)
    assert str(info.value) == message


def test_flags_in_their_modes_pass():
    inside_day = {"--strict": True, "--on-path": ("x",), "--pytorch-repo": "/p", "--package": "torch", "--binary": ()}
    overlay = {"--base": "r", "--binary": ("p=r",), "--strict": True, "--versions": []}
    assert refuse_flags({NIGHTLIES, INSIDE_DAY}, inside_day) is None
    assert refuse_flags({OVERLAY}, overlay) is None
    # The same flags out of those modes are refused: the modes, not the flags, let them through.
    for modes, given in (({RELEASES}, inside_day), ({NIGHTLIES}, overlay)):
        with pytest.raises(UsageError):
            refuse_flags(modes, given)
