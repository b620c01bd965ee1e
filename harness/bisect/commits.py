"""Bisection over a checkout's commits by Python overlay (``bisect --overlay PATH --good REV --bad REV``).

:func:`bisect_commits`, in order:

1. The binary is this interpreter's torch; the base (the checkout's commit it
   was built from) is ``--base REV``, else the binary's ``git_version``, which
   the checkout must hold (else a usage error that names ``--base``).
2. Too far is refused before anything runs (a usage error): an end, or the
   base, that declares another release line (``major.minor`` of
   ``version.txt``, or of a tracked ``torch/version.py``) than the binary.
3. The commits from ``--good`` to ``--bad`` on the first-parent line. A commit
   whose diff from the base touches compiled sources
   (:data:`~harness.bisect.overlay.COMPILED_PREFIXES`) is settled as a SKIP
   before any run, with the reason: the pure bisector is fed it up front and
   never asks for it.
4. Each commit the bisector asks about becomes an overlay tree
   (:mod:`harness.bisect.overlay`) in which ``python -m harness run`` runs the
   selection (:mod:`harness.bisect.driver`); verdicts are cached by commit and
   binary, so a second bisection of the range makes and runs nothing.
5. The answer (:class:`CommitBisection`): every commit's verdict, the commits
   that could not be tested (and, when the first bad commit may be one of
   them, the ``bisect-script`` command that builds them from source), and as
   the last two lines, for scripts::

       first bad commit: <40 hex>      ("one of <40 hex> <40 hex> ..." when skips leave it open)
       last good commit: <40 hex>
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from harness.bisect.bisector import Outcome, Verdict
from harness.bisect.builds import Build
from harness.bisect.checkout import Checkout, CheckoutError
from harness.bisect.driver import BisectRun, run_bisection
from harness.bisect.overlay import Binary, Overlays, probe_binary
from harness.bisect.verdicts import EVAL_TIMEOUT_S, Evaluation
from harness.paths import cache_root
from harness.selection import Selection


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


@dataclass
class CommitBisection:
    """A finished overlay bisection: the bisection of builds plus what the commits mean."""

    run: BisectRun
    checkout: Checkout
    base: str
    binary: Binary
    selection: Selection
    untestable: dict[int, str]  # index -> why

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
        among = [i for i in self.open_candidates if i in self.untestable]
        if not among:
            lines.append("  none of them can be the first bad commit: tested commits bracket it")
            return lines
        res = self.run.result
        sel = shlex.join(self.selection.argv())
        lines += ["  the first bad commit may be one of them; build them from source with a git bisect run step:",
                  f"    syncbn-harness bisect-script {sel} --build-cmd 'python setup.py develop' -o bisect-step.py",
                  f"    cd {shlex.quote(str(self.checkout.path))} && git bisect start {self.commit(res.first_bad)} "
                  f"{self.commit(res.last_good)} && git bisect run $PWD/bisect-step.py",
                  "  or lay the commits over a binary built after them (install a later nightly) and bisect again"]
        return lines

    def last_lines(self) -> list[str]:
        """``first bad commit: <sha>`` and ``last good commit: <sha>``, when the ends held."""
        res = self.run.result
        if res.outcome not in (Outcome.FOUND, Outcome.AMBIGUOUS):
            return []
        first = (self.commit(res.first_bad) if res.outcome is Outcome.FOUND
                 else "one of " + " ".join(self.commit(i) for i in res.candidates))
        return [f"first bad commit: {first}", f"last good commit: {self.commit(res.last_good)}"]

    @property
    def outcome(self) -> Outcome:
        return self.run.result.outcome

    def summary(self) -> str:
        return self.run.summary(extra=self.untested_lines(), tail=self.last_lines())

    def to_dict(self) -> dict:
        res = self.run.result
        return {**self.run.to_dict(), "mode": "overlay", "checkout": str(self.checkout.path), "base": self.base,
                "binary": {"version": self.binary.version, "git_version": self.binary.git_version,
                           "torch_dir": self.binary.torch_dir, "python": self.binary.python},
                "untestable": [{"commit": self.commit(i), "reason": why} for i, why in sorted(self.untestable.items())],
                "first_bad_commit": self.commit(res.first_bad) if res.outcome is Outcome.FOUND else None,
                "first_bad_candidates": [self.commit(i) for i in res.candidates],
                "last_good_commit": (self.commit(res.last_good)
                                     if res.outcome in (Outcome.FOUND, Outcome.AMBIGUOUS) else None)}


def commit_label(sha: str, subject: str) -> str:
    """``<12 hex> <subject>``, 40 characters at most."""
    text = f"{sha[:12]} {subject}"
    return text if len(text) <= 40 else text[:37] + "..."


def bisect_commits(*, checkout: str | Path, good: str, bad: str, selection: Optional[Selection] = None,
                   base: Optional[str] = None, rerun: bool = False, eval_timeout: float = EVAL_TIMEOUT_S,
                   store: Optional[Path] = None, log: Callable[[str], None] = lambda s: None) -> CommitBisection:
    """Bisect the commits from ``good`` to ``bad`` of ``checkout`` as overlays; see the module docstring."""
    selection = selection or Selection()
    repo = Checkout(checkout, "--overlay")
    good_sha, bad_sha = repo.require(good, "--good"), repo.require(bad, "--bad")
    if good_sha == bad_sha:
        raise CheckoutError(f"--good {good!r} and --bad {bad!r} are the same commit {good_sha}: give two commits")
    if selection.case_patterns:
        selection.cases  # noqa: B018 - an unknown pattern is a usage error before anything is made
    binary = probe_binary()
    base_sha = find_base(repo, binary, base)
    check_not_too_far(repo, binary, {"--good": good_sha, "--bad": bad_sha, "--base": base_sha})
    source = Overlays(repo, binary, base_sha, cache_root() / "overlays")
    builds = [Build("overlay", commit_label(sha, subject), package="torch", version=binary.version,
                    path=str(repo.path), commit=sha) for sha, subject in repo.first_parent_range(good_sha, bad_sha)]
    reasons = {i: source.plan(b.commit).untestable for i, b in enumerate(builds)}
    untestable = {i: why for i, why in reasons.items() if why}
    log(f"bisecting {len(builds)} commits of {repo.path} from {good_sha[:12]} (good) to {bad_sha[:12]} (bad) as "
        f"Python overlays on torch {binary.version} ({binary.torch_dir}, base {base_sha[:12]})"
        + (f"; {len(untestable)} cannot be overlaid" if untestable else ""))
    known = {i: Evaluation(Verdict.SKIP, why) for i, why in untestable.items()}
    run = run_bisection(builds, selection, source, known=known, rerun=rerun, eval_timeout=eval_timeout,
                        store=store, log=log)
    return CommitBisection(run, repo, base_sha, binary, selection, untestable)
