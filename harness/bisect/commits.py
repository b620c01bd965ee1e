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
     laid over that one binary (policy ``python`` of
     :class:`~harness.bisect.overlay.Overlays`); verdicts and records say
     which compiled changes were left out and whether any is on SyncBN's
     path. Last line: ``first bad commit (Python): <sha>``.
   - It passes: the culprit is compiled (or needs a compiled change). Nothing
     is bisected: the answer is a :class:`~harness.bisect.answers.CompiledSuspects`,
     the commits of the range whose own change touches SyncBN's
     path (:mod:`harness.bisect.syncbn_path`), with the
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
6. The answer (:class:`~harness.bisect.answers.CommitBisection`): every commit's verdict, approximate
   ones marked, the commits that could not be tested (and, when the first bad
   commit may be one of them, the ``bisect-script`` command that builds them
   from source), and as the last two lines, for scripts::

       first bad commit (Python): <40 hex>   (or "first bad commit: one of <40 hex> ..." when skips leave it open)
       last good commit: <40 hex>

Either answer gives the range's timeline, written once at the end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional, Sequence, Union

from harness.bisect.answers import CommitBisection, CompiledSuspects, plural
from harness.bisect.bisector import Verdict
from harness.bisect.builds import Build
from harness.bisect.checkout import Checkout, CheckoutError, Suspect
from harness.bisect.driver import BuildTester, run_bisection
from harness.bisect.overlay import Binary, OverlayPolicy, Overlays, PathKind, Target, classify, probe_binary
from harness.bisect.syncbn_path import ON_PATH, PathRule
from harness.bisect.verdicts import EVAL_TIMEOUT_S, Evaluation
from harness.paths import cache_folder
from harness.results import timeline
from harness.selection import Selection

OverlayAnswer = Union[CommitBisection, CompiledSuspects]


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


def commit_label(sha: str, subject: str) -> str:
    """``<12 hex> <subject>``, 40 characters at most."""
    text = f"{sha[:12]} {subject}"
    return text if len(text) <= 40 else text[:37] + "..."


def own_changes(repo: Checkout, source: Overlays, builds: list[Build]) -> tuple[list[Suspect], list[Suspect]]:
    """The commits after the good end whose own change (from the commit before on the line) touches compiled
    files, oldest first: those on SyncBN's path (with their files on it), and every one (with its first three
    compiled files)."""
    on_path, every = [], []
    for before, build in zip(builds, builds[1:]):
        compiled = [path for _, path in repo.changed(before.commit, build.commit)
                    if classify(path) is PathKind.COMPILED]
        if compiled:
            subject = repo.subject(build.commit)
            every.append(Suspect(build.commit, subject, compiled[:3]))
            files = source.rule.on_path(compiled, repo, before.commit, build.commit)
            if files:
                on_path.append(Suspect(build.commit, subject, files))
    return on_path, every


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
                   store: Optional[Path] = None, log: Callable[[str], None] = lambda s: None) -> OverlayAnswer:
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
    source = Overlays(repo, targets, cache_folder("overlays"), rule,
                      OverlayPolicy.STRICT if strict else OverlayPolicy.RELEVANCE)
    builds = [Build("overlay", commit_label(sha, subject), package="torch", version=targets[0].binary.version,
                    path=str(repo.path), commit=sha) for sha, subject in repo.first_parent_range(good_sha, bad_sha)]
    first = targets[0]
    store = Path(store or cache_folder("bisect") / "stores" / f"overlays-{first.binary.id}").absolute()
    tester = BuildTester(selection, source, rerun=rerun, eval_timeout=eval_timeout, store=store, log=log)
    log(f"bisecting {len(builds)} commits of {repo.path} from {good_sha[:12]} (good) to {bad_sha[:12]} (bad) as "
        f"Python overlays on torch {first.binary.version} ({first.binary.torch_dir}, base {first.base[:12]})"
        + "".join(f" or torch {t.binary.version} ({t.binary.torch_dir}, base {t.base[:12]})" for t in targets[1:]))
    log(rule.describe() if strict or on_path else "on SyncBN's path: the built-in globs (--on-path to change them)")
    answer = _answer(builds, repo, source, selection, tester, strict, log)
    timeline.write(store, answer.timeline())
    return answer


def _answer(builds: list[Build], repo: Checkout, source: Overlays, selection: Selection, tester: BuildTester,
            strict: bool, log: Callable[[str], None]) -> OverlayAnswer:
    """Ask first whether the culprit is Python or compiled (unless ``strict`` or the binary's base is after the
    good end), set the overlays' policy by the answer, then bisect (or list the compiled suspects)."""
    first, good_sha, bad_sha = source.targets[0], builds[0].commit, builds[-1].commit
    asked, known = None, {}
    if not strict and not repo.is_ancestor(first.base, good_sha):
        asked = (f"not asked whether the culprit is Python or compiled: the binary's base {first.base[:12]} is not "
                 f"at or before the good end {good_sha[:12]} (install the good end's nightly to ask)")
        log(asked)
    elif not strict:
        source.policy = OverlayPolicy.PYTHON
        ev = tester(builds[-1], f"[ask] {builds[-1].label}'s Python over torch {first.binary.version} "
                                f"(base {first.base[:12]})")
        words = f"asked first: the bad end's Python over the good end's binary (base {first.base[:12]})"
        left_out = source.plan(bad_sha).compiled
        if ev.verdict is Verdict.GOOD and left_out:
            asked = (f"{words} passes: the failure comes with compiled changes of the range "
                     f"({plural(len(left_out), 'compiled file')} differ)")
            log(asked)
            return CompiledSuspects.of(builds, repo, source, selection, tester.stats, asked,
                                       *own_changes(repo, source, builds))
        if ev.verdict is Verdict.BAD:
            known = {len(builds) - 1: ev}
            asked = f"{words} fails: the culprit is a Python change; every commit's Python laid over that binary"
        elif ev.verdict is Verdict.GOOD:  # nothing compiled differs: that was the bad end itself, and it passes
            known = {len(builds) - 1: ev}
            asked = f"{words} passes, and nothing compiled differs from the binary: the bad end is not bad"
        else:
            source.policy = OverlayPolicy.RELEVANCE
            asked = f"{words} could not be tested ({ev.reason}); commits on SyncBN's path are skipped instead"
        log(asked)
    untestable = {i: why for i, b in enumerate(builds) if (why := source.plan(b.commit).untestable)}
    if untestable:
        log(f"{len(untestable)} of {len(builds)} commits cannot be overlaid")
    known.update({i: Evaluation(Verdict.SKIP, why) for i, why in untestable.items()})
    run = run_bisection(builds, selection, source, known=known, tester=tester)
    approximate = {i: why for i in run.evaluations if i not in untestable
                   and (why := source.plan(builds[i].commit).approximation)}
    run.marks = {i: "~" for i in approximate}
    return CommitBisection(run, repo, source, selection, untestable, approximate, asked)
