"""Bisection over a checkout's commits by Python overlay (``bisect --overlay PATH --good REV --bad REV``).

:func:`bisect_commits`, in order:

1. The binaries: this interpreter's torch, its base (the checkout's commit it
   was built from) ``--base REV`` or else its ``git_version``, which the
   checkout must hold (else a usage error that names ``--base``); or, with
   ``--binary PYTHON=REV`` (repeatable, a date bisection passes its two
   nightlies), those interpreters' torch and bases. The first is the *good
   end's binary*.
2. Too far is refused before anything runs (a usage error): an end, or a
   base, that declares another release line (``major.minor`` of
   ``version.txt``, or of a tracked ``torch/version.py``) than the binary.
3. **Python or compiled, asked first** (unless ``--strict``, and only when the
   good end's binary was built at or before the good end): the bad end's
   Python laid over the good end's binary, whatever compiled files differ.
   - It fails: the culprit is a Python change. Every commit of the range is
     laid over that one binary (mode ``python`` of
     :class:`~harness.bisect.overlay.Overlays`); verdicts and records say
     which compiled changes were left out and whether any is on SyncBN's
     path. Last line: ``first bad commit (Python): <sha>``.
   - It passes: the culprit is compiled (or needs a compiled change). Nothing
     is bisected: the commits of the range whose own change touches SyncBN's
     path (:mod:`harness.bisect.syncbn_path`) are listed, with the
     ``bisect-script`` and ``git bisect start/skip/run`` commands that build
     only them. Last line: ``first bad commit is one of N compiled commits on
     SyncBN's path: <sha> ...``.
   - It cannot be tested (or was not asked): the relevance rule below.
4. **Relevance** (and ``--strict``): a commit whose compiled diff from its
   binary touches SyncBN's path (with ``--strict``: any compiled file) is
   settled as a SKIP before any run, naming the files; one whose compiled
   diff is off the path is tested as an approximate overlay. With two
   binaries each commit lies over the one with the smaller compiled diff.
5. Each commit the bisector asks about becomes an overlay tree in which
   ``python -m harness run`` runs the selection (:mod:`harness.bisect.driver`);
   verdicts are cached by commit and binary, so a second bisection of the
   range makes and runs nothing. Records go to ``--store`` (default: one store
   per binary under the cache), beside a timeline of the range
   (:mod:`harness.results.timeline`) that ``report`` orders the builds by.
6. The answer (:class:`CommitBisection`): every commit's verdict, approximate
   ones marked, the commits that could not be tested (and, when the first bad
   commit may be one of them, the ``bisect-script`` command that builds them
   from source), and as the last two lines, for scripts::

       first bad commit (Python): <40 hex>   (or "first bad commit: one of <40 hex> ..." when skips leave it open)
       last good commit: <40 hex>
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from harness.bisect.bisector import Outcome, Result, Verdict
from harness.bisect.builds import Build
from harness.bisect.checkout import Checkout, CheckoutError
from harness.bisect.driver import BisectRun, Judge, run_bisection
from harness.bisect.overlay import PYTHON, RELEVANCE, STRICT, Binary, Overlays, Target, classify, probe_binary
from harness.bisect.syncbn_path import COMPILED_PREFIXES, ON_PATH, PathRule
from harness.bisect.verdicts import EVAL_TIMEOUT_S, Evaluation
from harness.paths import cache_folder
from harness.results import timeline
from harness.selection import Selection

COMPILED = "compiled"  # the kind of a bisection whose culprit is compiled: nothing bisected


def release_line(version: str) -> Optional[tuple[int, int]]:
    """``(major, minor)`` of a version string (``2.13.0a0``, ``2.13.0+cpu``), None if it is not one."""
    from packaging.version import InvalidVersion, Version

    try:
        release = Version(version).release
    except InvalidVersion:
        return None
    return release[0], (release[1] if len(release) > 1 else 0)


def check_not_too_far(checkout: Checkout, binary: Binary, revs: dict[str, str]) -> None:
    """Refuse when any of ``revs`` (flag -> sha) declares another release line than the binary."""
    have = release_line(binary.version)
    for flag, sha in revs.items():
        declared = checkout.version_line(sha)
        if declared is None or have is None:
            continue
        line = release_line(declared[1])
        if line is not None and line != have:
            raise CheckoutError(
                f"{flag} {sha[:12]} is on another release line than the installed torch: its {declared[0]} says "
                f"{declared[1]}, the binary is {binary.version}; an overlay would be too far from the binary. "
                f"Install a build of the {line[0]}.{line[1]} line (a nightly near the commits: bisect by date "
                "first), or bisect commits of the binary's line")


def find_base(checkout: Checkout, binary: Binary, base: Optional[str]) -> str:
    """The checkout's commit the binary was built from: ``--base REV``, else its ``git_version``."""
    if base:
        return checkout.require(base, "--base")
    sha = checkout.resolve(binary.git_version) if binary.git_version not in ("", "Unknown", "None") else None
    if sha is None:
        raise CheckoutError(
            f"the installed torch {binary.version} was built from commit {binary.git_version}, which "
            f"{checkout.path} does not hold: fetch it (git -C {checkout.path} fetch origin {binary.git_version}), "
            "or give --base REV, the commit of this checkout the binary stands for (a fork, a mirror, a test "
            "repository)")
    return sha


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


@dataclass
class CommitBisection:
    """A finished overlay bisection: the bisection of builds plus what the commits mean.

    ``kind``: ``python`` (asked first: the bad end's Python fails over the good end's binary), ``compiled``
    (it passes: nothing bisected, ``candidates`` lists the compiled commits on SyncBN's path),
    ``relevance`` or ``strict`` (not asked: commits on SyncBN's path, or any compiled one, skipped).
    """

    run: BisectRun
    checkout: Checkout
    source: Overlays
    selection: Selection
    kind: str
    untestable: dict[int, str]  # index -> why
    approximate: dict[int, str] = field(default_factory=dict)  # index -> how far from the commit
    asked: Optional[str] = None  # what asking first said, one line
    candidates: list[dict] = field(default_factory=list)  # compiled kind: commit, subject, files on the path
    compiled_commits: int = 0  # compiled kind: commits of the range that change compiled files
    compiled_list: list[dict] = field(default_factory=list)  # compiled kind: every commit changing compiled files

    @property
    def binary(self) -> Binary:
        return self.source.binary

    @property
    def base(self) -> str:
        return self.source.base

    def commit(self, i: Optional[int]) -> Optional[str]:
        return self.run.builds[i].commit if i is not None else None

    @property
    def open_candidates(self) -> list[int]:
        """Indices the first bad commit may be at, when skipped commits leave it open."""
        res = self.run.result
        return list(res.candidates) if res.outcome is Outcome.AMBIGUOUS else []

    def untested_lines(self) -> list[str]:
        if not self.untestable:
            return []
        lines = [f"commits an overlay cannot test on {self.binary.version} (base {self.base[:12]}) "
                 f"({len(self.untestable)}):"]
        for i, why in sorted(self.untestable.items()):
            lines.append(f"  {self.run.builds[i].commit}  {why}")
        res = self.run.result
        if res.outcome in (Outcome.GOOD_END_NOT_GOOD, Outcome.BAD_END_NOT_BAD):
            end = 0 if res.outcome is Outcome.GOOD_END_NOT_GOOD else len(self.run.builds) - 1
            if end in self.untestable:
                lines.append("  an end cannot be overlaid, so nothing was bisected"
                             + ("; without --strict, compiled files off SyncBN's path only make an overlay "
                                "approximate" if self.kind == STRICT else
                                "; lay the commits over a binary built nearer to them (another nightly)"))
            return lines
        among = [i for i in self.open_candidates if i in self.untestable]
        if not among:
            lines.append("  none of them can be the first bad commit: tested commits bracket it")
            return lines
        lines += ["  the first bad commit may be one of them; build them from source with a git bisect run step:",
                  *self._build_commands(self.commit(res.last_good), self.commit(res.first_bad), None),
                  "  or lay the commits over a binary built after them (install a later nightly) and bisect again"]
        return lines

    def _build_commands(self, good: str, bad: str, only: Optional[list[dict]]) -> list[str]:
        """The ``bisect-script`` and ``git bisect`` lines; ``only``: the suspects (commit, files), the only
        commits git is to build (a pathspec of their files, and a skip for others that touch those files)."""
        sel = shlex.join(self.selection.argv())
        repo = shlex.quote(str(self.checkout.path))
        narrow, others = "", []
        if only is not None:
            # Off the path, every commit that changes compiled files is a suspect: the compiled folders.
            paths = (sorted({f.split(" (")[0] for c in only for f in c["files"]}) if self.candidates
                     else [p.rstrip("/") for p in COMPILED_PREFIXES])
            others = [c["commit"] for c in self.checkout.touching(good, bad, paths)
                      if c["commit"] not in {s["commit"] for s in only}]
            narrow = " -- " + " ".join(shlex.quote(p) for p in paths)
        step = shlex.quote(str(self.checkout.path / "bisect-step.py"))
        return [f"    syncbn-harness bisect-script {sel} --build-cmd 'python setup.py develop' -o {step}",
                f"    cd {repo}", f"    git bisect start {bad[:12]} {good[:12]}{narrow}",
                *([f"    git bisect skip {' '.join(c[:12] for c in others)}"] if others else []),
                "    git bisect run ./bisect-step.py"]

    def kind_lines(self) -> list[str]:
        """What asking first said, and for a compiled culprit the commits to build."""
        lines = [self.asked] if self.asked else []
        if self.approximate:
            on = sum(1 for i in self.approximate if self.source.plan(self.commit(i)).on_path)
            lines.append(f"~ approximate: {_plural(len(self.approximate), 'tested commit')} left compiled files "
                         "that differ from the binary out"
                         + (f", {on} of them on SyncBN's path" if on else ", none on SyncBN's path"))
        if len(self.source.targets) > 1 and self.kind != COMPILED:
            tested = sorted(i for i, ev in self.run.evaluations.items() if i not in self.untestable)
            for t in self.source.targets:
                over = [self.commit(i)[:12] for i in tested if self.source.plan(self.commit(i)).target == t]
                if over:
                    lines.append(f"laid over torch {t.binary.version} (base {t.base[:12]}): {' '.join(over)}")
        if self.kind != COMPILED:
            return lines
        good, bad = self.commit(0), self.commit(len(self.run.builds) - 1)
        if not self.compiled_commits:
            lines.append(f"no commit of the range changes compiled files: those that differ from the binary were "
                         f"changed between its base {self.base[:12]} and the good end; lay the range over a binary "
                         "built at the good end (its nightly) and bisect again")
            return lines
        if self.candidates:
            lines.append(f"of the {_plural(self.compiled_commits, 'commit')} in the range that change compiled "
                         f"files, {len(self.candidates)} on SyncBN's path:")
        else:
            lines.append(f"none of the {_plural(self.compiled_commits, 'commit')} in the range that change "
                         "compiled files touches SyncBN's path (widen it with --on-path); they are:")
        lines += [f"  {c['commit']}  {c['subject'][:60]}  [{', '.join(c['files'])}]" for c in self._suspects()]
        lines.append("build only those from source, with a git bisect run step:")
        lines += self._build_commands(good, bad, self._suspects())
        return lines

    def _suspects(self) -> list[dict]:
        return self.candidates or self.compiled_list

    def last_lines(self) -> list[str]:
        """The answer, of which kind, then ``last good commit: <sha>``, when the ends held."""
        res = self.run.result
        if self.kind == COMPILED and not self.compiled_commits:
            return ["first bad commit: unknown (compiled changes before the good end are needed to fail)",
                    f"last good commit: {self.commit(0)}"]
        if self.kind == COMPILED:
            shas = " ".join(c["commit"] for c in self._suspects())
            where = "on SyncBN's path" if self.candidates else "(none on SyncBN's path)"
            n = len(self._suspects())
            first = (f"first bad commit (compiled, the only one {where}): {shas}" if n == 1 and self.candidates
                     else f"first bad commit is one of {_plural(n, 'compiled commit')} {where}: {shas}")
            return [first,
                    f"last good commit: {self.commit(0)}"]
        if res.outcome not in (Outcome.FOUND, Outcome.AMBIGUOUS):
            return []
        if res.outcome is Outcome.AMBIGUOUS:
            first = "first bad commit: one of " + " ".join(self.commit(i) for i in res.candidates)
        elif self._across_binaries():
            first = (f"first bad commit (Python or compiled: its overlay and the last good one lie over different "
                     f"binaries): {self.commit(res.first_bad)}")
        else:
            first = f"first bad commit (Python): {self.commit(res.first_bad)}"
        return [first, f"last good commit: {self.commit(res.last_good)}"]

    def _across_binaries(self) -> bool:
        res = self.run.result
        plans = [self.source.plan(self.commit(i)) for i in (res.last_good, res.first_bad)]
        return plans[0].target != plans[1].target

    @property
    def outcome(self) -> Outcome:
        return self.run.result.outcome

    def summary(self) -> str:
        if self.kind == COMPILED:
            return "\n".join([*self.kind_lines(), self.run.counts(), *self.last_lines()])
        return self.run.summary(extra=self.kind_lines() + self.untested_lines(), tail=self.last_lines())

    def to_dict(self) -> dict:
        res = self.run.result
        found = res.outcome is Outcome.FOUND and self.kind != COMPILED
        return {**self.run.to_dict(), "mode": "overlay", "kind": self.kind, "asked": self.asked,
                "checkout": str(self.checkout.path), "base": self.base,
                "binaries": [{"version": t.binary.version, "git_version": t.binary.git_version, "base": t.base,
                              "torch_dir": t.binary.torch_dir, "python": t.binary.python}
                             for t in self.source.targets],
                "untestable": [{"commit": self.commit(i), "reason": why} for i, why in sorted(self.untestable.items())],
                "approximate": [{"commit": self.commit(i), "reason": why,
                                 "compiled_left_out": self.source.plan(self.commit(i)).compiled,
                                 "on_path": self.source.plan(self.commit(i)).on_path}
                                for i, why in sorted(self.approximate.items())],
                "first_bad_commit": self.commit(res.first_bad) if found else None,
                "first_bad_candidates": ([c["commit"] for c in self._suspects()] if self.kind == COMPILED
                                         else [self.commit(i) for i in res.candidates]),
                "last_good_commit": (self.commit(res.last_good)
                                     if res.outcome in (Outcome.FOUND, Outcome.AMBIGUOUS) else None)}


def commit_label(sha: str, subject: str) -> str:
    """``<12 hex> <subject>``, 40 characters at most."""
    text = f"{sha[:12]} {subject}"
    return text if len(text) <= 40 else text[:37] + "..."



def own_changes(repo: Checkout, source: Overlays, builds: list[Build]) -> list[dict]:
    """The commits after the good end whose own change (from the commit before on the line) touches compiled
    files: commit, subject, the compiled files and those on SyncBN's path, oldest first."""
    out = []
    for before, build in zip(builds, builds[1:]):
        compiled = [path for _, path in repo.changed(before.commit, build.commit) if classify(path) == "compiled"]
        if compiled:
            out.append({"commit": build.commit, "subject": repo.subject(build.commit), "compiled": compiled,
                        "files": source.rule.on_path(compiled, repo, before.commit, build.commit)})
    return out


def _targets(repo: Checkout, base: Optional[str], binaries: Sequence[str]) -> list[Target]:
    """The binaries to lay commits over: ``--binary PYTHON=REV`` each, or this interpreter's torch."""
    if not binaries:
        binary = probe_binary()
        return [Target(binary, find_base(repo, binary, base))]
    if base:
        raise CheckoutError("--base and --binary both name a base: give each binary's as --binary PYTHON=REV")
    out = []
    for spec in binaries:
        python, sep, rev = spec.rpartition("=")
        if not sep or not python or not rev:
            raise CheckoutError(f"--binary {spec!r} is not PYTHON=REV: give an interpreter whose torch to lay "
                                "commits over and the checkout's commit it was built from")
        base_sha = repo.require(rev, f"--binary {spec}")  # a wrong commit is refused before torch is imported
        out.append(Target(probe_binary(python), base_sha))
    return out


def bisect_commits(*, checkout: str | Path, good: str, bad: str, selection: Optional[Selection] = None,
                   base: Optional[str] = None, binaries: Sequence[str] = (), strict: bool = False,
                   on_path: Sequence[str] = (), rerun: bool = False, eval_timeout: float = EVAL_TIMEOUT_S,
                   store: Optional[Path] = None, log: Callable[[str], None] = lambda s: None) -> CommitBisection:
    """Bisect the commits from ``good`` to ``bad`` of ``checkout`` as overlays; see the module docstring."""
    selection = selection or Selection()
    repo = Checkout(checkout, "--overlay")
    good_sha, bad_sha = repo.require(good, "--good"), repo.require(bad, "--bad")
    if good_sha == bad_sha:
        raise CheckoutError(f"--good {good!r} and --bad {bad!r} are the same commit {good_sha}: give two commits")
    if selection.case_patterns:
        selection.cases  # noqa: B018 - an unknown pattern is a usage error before anything is made
    targets = _targets(repo, base, binaries)
    for t in targets:
        check_not_too_far(repo, t.binary, {"--good": good_sha, "--bad": bad_sha, "--base": t.base})
    rule = PathRule(tuple(on_path) or ON_PATH, strict)
    source = Overlays(repo, targets, cache_folder("overlays"), rule, STRICT if strict else RELEVANCE)
    builds = [Build("overlay", commit_label(sha, subject), package="torch", version=targets[0].binary.version,
                    path=str(repo.path), commit=sha) for sha, subject in repo.first_parent_range(good_sha, bad_sha)]
    first = targets[0]
    store = Path(store or cache_folder("bisect") / "stores" / f"overlays-{first.binary.id}").absolute()
    judge = Judge(selection, source, rerun=rerun, eval_timeout=eval_timeout, store=store, log=log)
    log(f"bisecting {len(builds)} commits of {repo.path} from {good_sha[:12]} (good) to {bad_sha[:12]} (bad) as "
        f"Python overlays on torch {first.binary.version} ({first.binary.torch_dir}, base {first.base[:12]})"
        + "".join(f" or torch {t.binary.version} ({t.binary.torch_dir}, base {t.base[:12]})" for t in targets[1:]))
    log(rule.describe() if strict or on_path else "on SyncBN's path: the built-in globs (--on-path to change them)")

    kind, asked, known = source.mode, None, {}
    if not strict and not repo.is_ancestor(first.base, good_sha):
        asked = (f"not asked whether the culprit is Python or compiled: the binary's base {first.base[:12]} is not "
                 f"at or before the good end {good_sha[:12]} (install the good end's nightly to ask)")
        log(asked)
    elif not strict:
        source.mode = PYTHON
        ev = judge(builds[-1], f"[ask] {builds[-1].label}'s Python over torch {first.binary.version} "
                               f"(base {first.base[:12]})")
        words = f"asked first: the bad end's Python over the good end's binary (base {first.base[:12]})"
        left_out = source.plan(bad_sha).compiled
        if ev.verdict is Verdict.GOOD and left_out:
            asked = (f"{words} passes: the failure comes with compiled changes of the range "
                     f"({_plural(len(left_out), 'compiled file')} differ)")
            log(asked)
            result = _compiled(builds, repo, source, selection, judge, asked)
            timeline.write(store, timeline_of(result))
            return result
        if ev.verdict is Verdict.BAD:
            kind, known = PYTHON, {len(builds) - 1: ev}
            asked = f"{words} fails: the culprit is a Python change; every commit's Python laid over that binary"
        elif ev.verdict is Verdict.GOOD:  # nothing compiled differs: that was the bad end itself, and it passes
            kind, known = PYTHON, {len(builds) - 1: ev}
            asked = f"{words} passes, and nothing compiled differs from the binary: the bad end is not bad"
        else:
            source.mode = kind = RELEVANCE
            asked = f"{words} could not be tested ({ev.reason}); commits on SyncBN's path are skipped instead"
        log(asked)
    untestable = {i: why for i, b in enumerate(builds) if (why := source.plan(b.commit).untestable)}
    if untestable:
        log(f"{len(untestable)} of {len(builds)} commits cannot be overlaid")
    known.update({i: Evaluation(Verdict.SKIP, why) for i, why in untestable.items()})
    run = run_bisection(builds, selection, source, known=known, judge=judge)
    approximate = {i: why for i in run.evaluations if i not in untestable
                   and (why := source.plan(builds[i].commit).approximation)}
    run.marks = {i: "~" for i in approximate}
    result = CommitBisection(run, repo, source, selection, kind, untestable, approximate, asked)
    timeline.write(store, timeline_of(result))
    return result


def _compiled(builds: list[Build], repo: Checkout, source: Overlays, selection: Selection, judge: Judge,
              asked: str) -> CommitBisection:
    """The answer when the bad end's Python passes over the good end's binary: the compiled suspects."""
    changes = own_changes(repo, source, builds)
    on_path = [{"commit": c["commit"], "subject": c["subject"], "files": c["files"]} for c in changes if c["files"]]
    every = [{"commit": c["commit"], "subject": c["subject"], "files": c["compiled"][:3]} for c in changes]
    index = {b.commit: i for i, b in enumerate(builds)}
    suspects = [index[c["commit"]] for c in (on_path or every)]
    result = Result(Outcome.AMBIGUOUS, last_good=0, first_bad=len(builds) - 1, candidates=suspects)
    run = BisectRun(builds, result, {}, judge.stats, created=(source.stat, source.noun))
    return CommitBisection(run, repo, source, selection, COMPILED, {}, {}, asked, on_path, len(changes), every)


def timeline_of(result: CommitBisection) -> dict:
    """The range in branch order, for the report: each commit, its verdict, how approximate."""
    commits = []
    for i, b in enumerate(result.run.builds):
        ev = result.run.evaluations.get(i)
        commits.append({"commit": b.commit, "label": b.label, "verdict": ev.verdict.value if ev else None,
                        "approximate": result.approximate.get(i), "untestable": result.untestable.get(i)})
    return {"checkout": str(result.checkout.path), "kind": result.kind, "commits": commits}
