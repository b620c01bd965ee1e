"""What a bisection answers, one class per mode, each rendering itself.

Every mode's answer is an :class:`Answer`: its ``outcome`` (the exit code's
source), ``summary()`` (what a person reads), ``last_lines()`` (the lines
scripts read: ``first bad commit: ...`` then ``last good commit: ...``) and
``to_dict()`` (``--format json``). ``bisect`` prints whichever it got, without
asking which:

- releases, wheels, interpreters: :class:`~harness.bisect.driver.BisectRun`;
- nightlies by day: :class:`~harness.bisect.nightly.NightlyBisection`, which
  holds the in-day answer below when it ran;
- a checkout's commits as overlays (:mod:`harness.bisect.commits`), by what
  asking first said: :class:`CommitBisection` when commits were bisected
  (``python``, ``relevance`` or ``strict``: the
  :class:`~harness.bisect.overlay.OverlayPolicy`), :class:`CompiledSuspects`
  when the bad end's Python passes over the good end's binary, so nothing is
  bisected: the compiled commits that may be the culprit and the ``git
  bisect`` commands that build only them.

The two overlay answers also give the range's timeline
(:mod:`harness.results.timeline`), which the caller writes once.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Optional, Protocol, runtime_checkable

from harness.bisect.bisector import Outcome
from harness.bisect.builds import Build
from harness.bisect.checkout import Checkout, Suspect
from harness.bisect.driver import BisectRun, counts
from harness.bisect.overlay import Binary, OverlayPolicy, Overlays, PathKind
from harness.bisect.syncbn_path import COMPILED_PREFIXES
from harness.bisect.verdicts import Evaluation
from harness.selection import Selection


@runtime_checkable
class Answer(Protocol):
    """A finished bisection of any mode, as ``bisect`` prints it."""

    @property
    def outcome(self) -> Outcome:
        """Where the bisection stands; a wrong end makes ``bisect`` exit 1."""
        ...

    def summary(self) -> str:
        """What a person reads at the end; its last lines are :meth:`last_lines`."""
        ...

    def last_lines(self) -> list[str]:
        """``first bad commit: ...`` and ``last good commit: ...`` when the mode names commits, else none."""
        ...

    def to_dict(self) -> dict:
        """The JSON answer (``--format json``)."""
        ...


def plural(n: int, word: str) -> str:
    """``1 commit``, ``2 commits``."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def build_commands(checkout: Checkout, selection: Selection, good: str, bad: str,
                   only: Optional[list[Suspect]] = None, on_path: bool = False) -> list[str]:
    """The ``bisect-script`` and ``git bisect`` lines that build commits from ``good`` to ``bad`` from source.

    ``only``: the suspects, the only commits git is to build (a pathspec of their files, and a skip for the
    others that touch those files); ``on_path``: they are the commits on SyncBN's path, else every commit
    that changes compiled files (the pathspec is then the compiled folders).
    """
    sel = shlex.join(selection.argv())
    repo = shlex.quote(str(checkout.path))
    narrow, others = "", []
    if only is not None:
        paths = (sorted({f.split(" (")[0] for c in only for f in c.files}) if on_path
                 else [p.rstrip("/") for p in COMPILED_PREFIXES])
        named = {c.commit for c in only}
        others = [c.commit for c in checkout.touching(good, bad, paths) if c.commit not in named]
        narrow = " -- " + " ".join(shlex.quote(p) for p in paths)
    step = shlex.quote(str(checkout.path / "bisect-step.py"))
    return [f"    syncbn-harness bisect-script {sel} --build-cmd 'python setup.py develop' -o {step}",
            f"    cd {repo}", f"    git bisect start {bad[:12]} {good[:12]}{narrow}",
            *([f"    git bisect skip {' '.join(c[:12] for c in others)}"] if others else []),
            "    git bisect run ./bisect-step.py"]


def _overlay_fields(checkout: Checkout, source: Overlays, kind: str, asked: Optional[str]) -> dict:
    """The JSON both overlay answers share: the mode, the kind, the checkout and the binaries."""
    return {"mode": "overlay", "kind": kind, "asked": asked, "checkout": str(checkout.path), "base": source.base,
            "binaries": [{"version": t.binary.version, "git_version": t.binary.git_version, "base": t.base,
                          "torch_dir": t.binary.torch_dir, "python": t.binary.python} for t in source.targets]}


def _timeline(checkout: Checkout, kind: str, builds: list[Build], evaluations: dict[int, Evaluation],
              approximate: dict[int, str], untestable: dict[int, str]) -> dict:
    """The range in branch order, for the report: each commit, its verdict, how approximate."""
    commits = []
    for i, b in enumerate(builds):
        ev = evaluations.get(i)
        commits.append({"commit": b.commit, "label": b.label, "verdict": ev.verdict.value if ev else None,
                        "approximate": approximate.get(i), "untestable": untestable.get(i)})
    return {"checkout": str(checkout.path), "kind": kind, "commits": commits}


@dataclass
class CommitBisection:
    """A finished overlay bisection of commits: the bisection of builds plus what the commits mean.

    Its kind is the overlays' policy: ``python`` (asked first: the bad end's Python fails over the good end's
    binary), ``relevance`` or ``strict`` (not asked: commits on SyncBN's path, or any compiled one, skipped).
    """

    run: BisectRun
    checkout: Checkout
    source: Overlays
    selection: Selection
    untestable: dict[int, str]  # index -> why
    approximate: dict[int, str] = field(default_factory=dict)  # index -> how far from the commit
    asked: Optional[str] = None  # what asking first said, one line

    @property
    def kind(self) -> OverlayPolicy:
        """What a compiled difference meant to the overlays this bisection tested."""
        return self.source.policy

    @property
    def binary(self) -> Binary:
        return self.source.binary

    @property
    def base(self) -> str:
        return self.source.base

    @property
    def outcome(self) -> Outcome:
        return self.run.result.outcome

    def commit(self, i: Optional[int]) -> Optional[str]:
        """The commit of build ``i`` (None for None)."""
        return self.run.builds[i].commit if i is not None else None

    @property
    def open_candidates(self) -> list[int]:
        """Indices the first bad commit may be at, when skipped commits leave it open."""
        res = self.run.result
        return list(res.candidates) if res.outcome is Outcome.AMBIGUOUS else []

    def untested_lines(self) -> list[str]:
        """The commits an overlay cannot test, and whether the first bad commit may be among them."""
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
                                "approximate" if self.kind is OverlayPolicy.STRICT else
                                "; lay the commits over a binary built nearer to them (another nightly)"))
            return lines
        among = [i for i in self.open_candidates if i in self.untestable]
        if not among:
            lines.append("  none of them can be the first bad commit: tested commits bracket it")
            return lines
        lines += ["  the first bad commit may be one of them; build them from source with a git bisect run step:",
                  *build_commands(self.checkout, self.selection, self.commit(res.last_good),
                                  self.commit(res.first_bad)),
                  "  or lay the commits over a binary built after them (install a later nightly) and bisect again"]
        return lines

    def kind_lines(self) -> list[str]:
        """What asking first said, how approximate the tested overlays were, which binary each lay over."""
        lines = [self.asked] if self.asked else []
        if self.approximate:
            on = sum(1 for i in self.approximate if self.source.plan(self.commit(i)).on_path)
            lines.append(f"~ approximate: {plural(len(self.approximate), 'tested commit')} left compiled files "
                         "that differ from the binary out"
                         + (f", {on} of them on SyncBN's path" if on else ", none on SyncBN's path"))
        if len(self.source.targets) > 1:
            tested = sorted(i for i in self.run.evaluations if i not in self.untestable)
            for t in self.source.targets:
                over = [self.commit(i)[:12] for i in tested if self.source.plan(self.commit(i)).target == t]
                if over:
                    lines.append(f"laid over torch {t.binary.version} (base {t.base[:12]}): {' '.join(over)}")
        return lines

    def last_lines(self) -> list[str]:
        """The first bad commit, of which kind, then ``last good commit: <sha>``, when the ends held."""
        res = self.run.result
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

    def summary(self) -> str:
        """The verdicts, the answer, the records that differ, what the commits mean, the counts, the last lines."""
        return self.run.summary(extra=self.kind_lines() + self.untested_lines(), tail=self.last_lines())

    def to_dict(self) -> dict:
        """The bisection's JSON, with the binaries, the untestable and the approximate commits."""
        res = self.run.result
        return {**self.run.to_dict(), **_overlay_fields(self.checkout, self.source, self.kind.value, self.asked),
                "untestable": [{"commit": self.commit(i), "reason": why} for i, why in sorted(self.untestable.items())],
                "approximate": [{"commit": self.commit(i), "reason": why,
                                 "compiled_left_out": self.source.plan(self.commit(i)).compiled,
                                 "on_path": self.source.plan(self.commit(i)).on_path}
                                for i, why in sorted(self.approximate.items())],
                "first_bad_commit": self.commit(res.first_bad) if res.outcome is Outcome.FOUND else None,
                "first_bad_candidates": [self.commit(i) for i in res.candidates],
                "last_good_commit": (self.commit(res.last_good)
                                     if res.outcome in (Outcome.FOUND, Outcome.AMBIGUOUS) else None)}

    def timeline(self) -> dict:
        """The range in branch order with each commit's verdict (:mod:`harness.results.timeline`)."""
        return _timeline(self.checkout, self.kind.value, self.run.builds, self.run.evaluations, self.approximate,
                         self.untestable)


@dataclass
class CompiledSuspects:
    """The answer when the bad end's Python passes over the good end's binary: the culprit is compiled.

    Nothing is bisected. ``suspects``: the commits of the range whose own change touches SyncBN's path
    (``on_path``), else every commit that changes compiled files (``compiled_commits`` of them, none when
    the compiled files that differ were changed before the good end); ``commands``: the ``bisect-script``
    and ``git bisect`` lines that build only the suspects from source.
    """

    builds: list[Build]
    checkout: Checkout
    source: Overlays
    stats: dict  # the build tester's counts (the one run: the question asked first)
    asked: str
    suspects: list[Suspect]
    on_path: bool
    compiled_commits: int
    commands: list[str] = field(default_factory=list)

    kind = PathKind.COMPILED

    @classmethod
    def of(cls, builds: list[Build], checkout: Checkout, source: Overlays, selection: Selection, stats: dict,
           asked: str, on_path: list[Suspect], every: list[Suspect]) -> "CompiledSuspects":
        """The suspects (``on_path``, else ``every``) and the commands that build only them."""
        suspects = on_path or every
        commands = (build_commands(checkout, selection, builds[0].commit, builds[-1].commit, suspects,
                                   bool(on_path)) if every else [])
        return cls(builds, checkout, source, stats, asked, suspects, bool(on_path), len(every), commands)

    @property
    def outcome(self) -> Outcome:
        """Ambiguous: the first bad commit is one of the suspects (or unknown when there are none)."""
        return Outcome.AMBIGUOUS

    def lines(self) -> list[str]:
        """What asking first said, then the suspects and the commands that build them."""
        lines = [self.asked]
        if not self.compiled_commits:
            lines.append(f"no commit of the range changes compiled files: those that differ from the binary were "
                         f"changed between its base {self.source.base[:12]} and the good end; lay the range over a "
                         "binary built at the good end (its nightly) and bisect again")
            return lines
        if self.on_path:
            lines.append(f"of the {plural(self.compiled_commits, 'commit')} in the range that change compiled "
                         f"files, {len(self.suspects)} on SyncBN's path:")
        else:
            lines.append(f"none of the {plural(self.compiled_commits, 'commit')} in the range that change "
                         "compiled files touches SyncBN's path (widen it with --on-path); they are:")
        lines += [s.line(60) for s in self.suspects]
        lines.append("build only those from source, with a git bisect run step:")
        return lines + self.commands

    def last_lines(self) -> list[str]:
        """``first bad commit ... compiled ...: <sha> ...`` then ``last good commit: <the good end>``."""
        good = f"last good commit: {self.builds[0].commit}"
        if not self.compiled_commits:
            return ["first bad commit: unknown (compiled changes before the good end are needed to fail)", good]
        shas = " ".join(s.commit for s in self.suspects)
        where = "on SyncBN's path" if self.on_path else "(none on SyncBN's path)"
        n = len(self.suspects)
        first = (f"first bad commit (compiled, the only one {where}): {shas}" if n == 1 and self.on_path
                 else f"first bad commit is one of {plural(n, 'compiled commit')} {where}: {shas}")
        return [first, good]

    def summary(self) -> str:
        """The suspects and the commands, the counts, the last lines."""
        return "\n".join([*self.lines(), counts(self.stats, self.source.stat, self.source.noun),
                          *self.last_lines()])

    def to_dict(self) -> dict:
        """The JSON of a bisection's answer (nothing tested in the range), with the suspects and the commands."""
        index = {b.commit: i for i, b in enumerate(self.builds)}
        good = self.builds[0]
        return {"builds": [{**b.to_dict(), "verdict": None} for b in self.builds],
                "result": {"outcome": self.outcome.value, "last_good": 0, "first_bad": None,
                           "candidates": [index[s.commit] for s in self.suspects], "skipped": [],
                           "end_verdict": None},
                "first_bad": None, "last_good": good.label, "differing": [], "stats": self.stats,
                **_overlay_fields(self.checkout, self.source, self.kind.value, self.asked),
                "untestable": [], "approximate": [], "first_bad_commit": None,
                "first_bad_candidates": [s.commit for s in self.suspects], "last_good_commit": good.commit,
                "suspects": [s.to_dict() for s in self.suspects], "suspects_on_path": self.on_path,
                "compiled_commits": self.compiled_commits, "commands": [c.strip() for c in self.commands]}

    def timeline(self) -> dict:
        """The range in branch order, none of it tested (:mod:`harness.results.timeline`)."""
        return _timeline(self.checkout, self.kind.value, self.builds, {}, {}, {})
