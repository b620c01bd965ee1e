"""Nightlies by date (``bisect --good 2026-10-01 --bad 2026-11-01``): day specs, each day's nightly, their commits.

A nightly is a pre-release ``X.Y.Z.devYYYYMMDD`` on the configured index
(``torch==2.13.0.dev20261005`` on PyTorch's nightly index, or any package
with such versions: ``--package``).

1. An end is a day (``2026-10-01``) or a nightly's version
   (``2.13.0.dev20261001``, ``torch==2.13.0.dev20261001``); two such ends start
   this mode (:func:`is_nightly_spec`).
2. The candidates are the index's versions (``pip index versions PKG --pre``,
   the index options passed on) or ``--versions``; only ``.devYYYYMMDD`` ones
   count, one per day: the highest of that day (where a release branch's
   nightly and main's share a day, main's is the higher).
3. :func:`nightly_range` keeps the days from the good end to the bad one
   (the good end may be the newer: looking for a fix runs backwards). A day
   with no nightly (it failed, or expired from the index) is not in the list
   and is named in the result, never fatal; an end day without one moves
   inward to the nearest day that has one (said so); fewer than two nightlies
   in the range is a usage error naming the days around it that have one.
4. The bisection is the one of releases: a cached environment per nightly
   (:mod:`harness.bisect.driver`).
5. What a nightly was built from (:func:`git_version`): for torch the records'
   ``torch_git_version``; otherwise ``<module>.version.git_version`` asked in
   its environment (torchvision and torchaudio have one). When there is none
   the result says so and why; it never makes one up.
6. ``--pytorch-repo PATH``, a local clone that holds the ``nightly`` branch: a
   nightly's ``git_version`` is a commit whose subject reads ``YYYY-MM-DD
   nightly release (<main sha>)`` (:meth:`~harness.bisect.checkout.Checkout.nightly_main`);
   the result gives the main commits between the last good and the first bad
   nightly, those that touch SyncBN's files and a compare link.
7. With that clone and torch, the bisection goes on **inside the day**
   (:mod:`harness.bisect.commits`): the main commits between the two
   nightlies laid over the two nightlies' environments, the last good one
   first (the good end's binary the Python-or-compiled question is asked
   over), each commit over the one with the smaller compiled diff when the
   overlays are bisected by relevance (``--strict``, or when the question
   cannot be asked). Its answer is the result's last lines.

The answer (:class:`NightlyBisection`, made once everything above is known)
ends with two lines: ``first bad commit: <sha>`` and ``last good commit: <sha>``,
the two nightlies' ``git_version`` (``unknown (why)`` when there is none), or
the in-day bisection's last two lines when it ran.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, NamedTuple, Optional, Sequence

from harness.bisect import children
from harness.bisect.answers import Answer
from harness.bisect.bisector import Outcome
from harness.bisect.builds import Build, IndexOptions, available_versions
from harness.bisect.checkout import SYNCBN_FILES, Checkout, Suspect, compare_link
from harness.bisect.commits import bisect_commits
from harness.bisect.driver import BisectRun, bisect_releases
from harness.bisect.verdicts import EVAL_TIMEOUT_S, Evaluation
from harness.errors import UsageError
from harness.selection import Selection

PROBE_TIMEOUT_S = 120.0
_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_DEV = re.compile(r"\.dev(\d{8})(?:\+[A-Za-z0-9.]+)?$")
_SPEC = re.compile(r"^(?:([A-Za-z0-9][A-Za-z0-9._-]*)==)?(\d+(?:\.\d+)*\.dev\d{8}(?:\+[A-Za-z0-9.]+)?)$")
_SHA = re.compile(r"^[0-9a-f]{7,40}$")
_GIT_VERSION_PROBE = """
import importlib, json, sys
try:
    m = importlib.import_module(sys.argv[1] + ".version")
except Exception as e:
    print(json.dumps({"why": "%s.version does not import (%s)" % (sys.argv[1], type(e).__name__)}))
else:
    print(json.dumps({"git_version": getattr(m, "git_version", None)}))
"""


def nightly_day(version: str) -> Optional[datetime.date]:
    """The day of a ``.devYYYYMMDD`` version, or None."""
    m = _DEV.search(version)
    if not m:
        return None
    try:
        return datetime.datetime.strptime(m.group(1), "%Y%m%d").date()
    except ValueError:
        return None


def is_nightly_spec(text: str) -> bool:
    """Whether a ``--good``/``--bad`` value names a nightly: a day, or a ``.devYYYYMMDD`` version."""
    text = text.strip()
    return bool(_DAY.match(text) or _SPEC.match(text))


@dataclass(frozen=True)
class End:
    """One end: its day, and the exact version and package when the spec named them."""

    day: datetime.date
    version: Optional[str] = None
    package: Optional[str] = None


def parse_end(text: str, flag: str) -> End:
    """A day or nightly spec as an :class:`End`; anything else is a usage error naming the forms."""
    text = text.strip()
    if _DAY.match(text):
        try:
            return End(datetime.date.fromisoformat(text))
        except ValueError:
            raise UsageError(f"{flag} {text!r} is not a day of the calendar: give YYYY-MM-DD") from None
    m = _SPEC.match(text)
    day = nightly_day(m.group(2)) if m else None
    if day is None:
        raise UsageError(f"{flag} {text!r} is not a nightly: give a day (2026-10-01) or a nightly version "
                         "(2.13.0.dev20261001, torch==2.13.0.dev20261001)")
    return End(day, m.group(2), m.group(1))


def _days_text(days: Sequence[datetime.date]) -> str:
    """``2026-10-04, 2026-10-10..2026-10-12``: runs of consecutive days collapsed."""
    runs: list[list[datetime.date]] = []
    for d in sorted(days):
        if runs and (d - runs[-1][-1]).days == 1:
            runs[-1].append(d)
        else:
            runs.append([d])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}..{r[-1]}" for r in runs)


@dataclass
class NightlyRange:
    """The nightlies to bisect, in order (good end first), their days, the days without one, notes."""

    package: str
    builds: list[Build]
    days: list[datetime.date]
    missing: list[datetime.date] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def nightly_range(good: str, bad: str, versions: Sequence[str], package: Optional[str] = None) -> NightlyRange:
    """The nightly of each day from ``good`` to ``bad`` among ``versions`` (see the module docstring)."""
    from packaging.version import InvalidVersion, Version

    g, b = parse_end(good, "--good"), parse_end(bad, "--bad")
    named = {p for p in (g.package, b.package, package) if p}
    if len(named) > 1:
        raise UsageError(f"the ends and --package name different packages ({', '.join(sorted(named))}): "
                         "bisect one package's nightlies")
    package = named.pop() if named else "torch"
    if g.day == b.day:
        raise UsageError(f"--good and --bad are the same day {g.day}: give two days")
    by_day: dict[datetime.date, tuple[Version, str]] = {}
    for v in versions:
        day = nightly_day(v)
        try:
            parsed = Version(v)
        except InvalidVersion:
            continue
        if day is not None and (day not in by_day or parsed > by_day[day][0]):
            by_day[day] = (parsed, v)
    for end in (g, b):
        if end.version:  # an exact version given is that day's nightly, listed or not
            by_day[end.day] = (Version(end.version), end.version)
    lo, hi = min(g.day, b.day), max(g.day, b.day)
    inside = sorted(d for d in by_day if lo <= d <= hi)
    if len(inside) < 2:
        before = max((d for d in by_day if d < lo), default=None)
        after = min((d for d in by_day if d > hi), default=None)
        near = ", ".join(f"{d} ({by_day[d][1]})" for d in (before, after) if d) or "none at all"
        raise UsageError(f"the index has {len(inside)} nightly of {package} from {lo} to {hi}, a bisection needs "
                         f"two: widen the range (nearest days with one: {near}), or check --index-url/--find-links "
                         "and --package")
    notes = []
    for end, flag, moved in ((g, "--good", inside[0] if g.day == lo else inside[-1]),
                             (b, "--bad", inside[-1] if b.day == hi else inside[0])):
        if end.day != moved:
            notes.append(f"no nightly of {package} on {end.day}: the {flag[2:]} end is {moved}'s "
                         f"({package}=={by_day[moved][1]})")
    missing = [inside[0] + datetime.timedelta(days=k) for k in range((inside[-1] - inside[0]).days + 1)]
    missing = [d for d in missing if d not in by_day]
    ordered = inside if g.day < b.day else list(reversed(inside))
    builds = [Build("release", f"{package}=={by_day[d][1]}", package=package, version=by_day[d][1]) for d in ordered]
    return NightlyRange(package, builds, ordered, missing, notes)


class BuiltFrom(NamedTuple):
    """What a nightly was built from: its ``git_version`` and where that was read, or None and why not."""

    sha: Optional[str]
    where: str

    def text(self) -> str:
        """The sha, or ``unknown (why)``."""
        return self.sha or f"unknown ({self.where})"


def git_version(package: str, ev: Optional[Evaluation]) -> BuiltFrom:
    """``(sha, where from)`` of what a tested nightly was built from, or ``(None, why not)``."""
    if ev is None:
        return BuiltFrom(None, "not tested")
    if package == "torch":
        for r in ev.records:
            gv = str(r.torch_git_version or "")
            if _SHA.match(gv):
                return BuiltFrom(gv, "torch.version.git_version")
    if not ev.python or not Path(ev.python).exists():
        return BuiltFrom(None, "its environment is gone: bisect again with --rerun")
    module = re.sub(r"[-.]", "_", package).lower()
    try:
        proc = children.run([ev.python, "-c", _GIT_VERSION_PROBE, module], timeout=PROBE_TIMEOUT_S,
                            cwd=os.path.expanduser("~"))
        d = json.loads(proc.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, ValueError, IndexError):
        return BuiltFrom(None, f"asking {module}.version.git_version failed")
    if "why" in d:
        return BuiltFrom(None, d["why"])
    gv = d.get("git_version")
    if not isinstance(gv, str) or not _SHA.match(gv):
        return BuiltFrom(None, f"{module}.version.git_version is {gv!r}, not a commit")
    return BuiltFrom(gv, f"{module}.version.git_version")


@dataclass
class MainRange:
    """The main commits between two nightlies: the ends, how many, those touching SyncBN's files, a compare
    link; or only ``why`` they are unknown."""

    good_main: str = ""
    bad_main: str = ""
    commits: int = 0
    touching: list[Suspect] = field(default_factory=list)
    compare: str = ""
    why: Optional[str] = None

    def lines(self, repo: Checkout) -> list[str]:
        """``main commits between them: ...``, the commits touching SyncBN's files, the compare link."""
        if self.why:
            return [f"main commits between them: unknown ({self.why})"]
        return [f"main commits between them: {self.commits} ({self.good_main[:12]}..{self.bad_main[:12]} "
                f"in {repo.path})", f"touching SyncBN's files ({len(self.touching)}):",
                *[c.line(70) for c in self.touching], f"compare: {self.compare}"]

    def to_dict(self) -> dict:
        """``{"why": ...}``, or the ends, the count, the commits touching SyncBN's files, the link."""
        if self.why:
            return {"why": self.why}
        return {"good_main": self.good_main, "bad_main": self.bad_main, "commits": self.commits,
                "touching": [c.to_dict() for c in self.touching], "compare": self.compare}


def main_range(repo: Checkout, good_gv: str, bad_gv: str) -> MainRange:
    """The main commits between two nightlies' ``git_version`` in ``repo``, or why they are unknown."""
    mains = []
    for gv in (good_gv, bad_gv):
        sha = repo.resolve(gv)
        if sha is None:
            return MainRange(why=f"{repo.path} does not hold {gv}: git -C {repo.path} fetch origin nightly")
        named = repo.nightly_main(sha)
        mains.append(named[1] if named else sha)  # not a nightly-release commit: a main commit itself
    good_main, bad_main = mains
    old, new = (good_main, bad_main) if repo.is_ancestor(good_main, bad_main) else (bad_main, good_main)
    return MainRange(good_main, bad_main, repo.count(old, new), repo.touching(old, new, SYNCBN_FILES),
                     compare_link(old, new))


@dataclass
class NightlyBisection:
    """A finished date bisection: the bisection of nightlies plus their commits and the main range."""

    run: BisectRun
    nightlies: NightlyRange
    selection: Selection
    repo: Optional[Checkout] = None
    commits: dict[str, BuiltFrom] = field(default_factory=dict)  # "last_good"/"first_bad" -> what it was built from
    main: Optional[MainRange] = None
    inside: Optional[Answer] = None  # the in-day overlay bisection, when it ran
    inside_why: Optional[str] = None  # why it did not run, when it could have

    def extra_lines(self) -> list[str]:
        """The days without a nightly, the two nightlies' commits, the main range, the in-day bisection."""
        n = self.nightlies
        lines = [f"days without a nightly of {n.package} ({len(n.missing)}): {_days_text(n.missing)}"
                 if n.missing else f"every day from {min(n.days)} to {max(n.days)} has a nightly of {n.package}"]
        lines += n.notes
        res = self.run.result
        for name, i in (("last good", res.last_good), ("first bad", res.first_bad)):
            key = name.replace(" ", "_")
            if key in self.commits:
                sha, where = self.commits[key]
                lines.append(f"{name} nightly: {self.run.builds[i].label} ({n.days[i]}), "
                             + (f"built from {sha} ({where})" if sha else f"git_version unknown: {where}"))
        if self.commits and self.repo is None:
            lines.append("main commits between them: give --pytorch-repo PATH (a clone with the nightly branch)")
        if self.main:
            lines += self.main.lines(self.repo)
        if self.inside_why:
            lines.append(f"inside the day: not bisected ({self.inside_why})")
        if self.inside is not None:
            lines.append("inside the day, the main commits laid over the two nightlies:")
            lines += ["  " + line for line in self.inside.summary().splitlines()[:-2]]
        return lines

    def last_lines(self) -> list[str]:
        """The in-day bisection's last lines when it ran, else the two nightlies' commits."""
        if self.inside is not None and self.inside.last_lines():
            return self.inside.last_lines()
        if not self.commits:
            return []
        res = self.run.result
        if res.outcome is Outcome.AMBIGUOUS:  # the first bad nightly is one of the untested ones, or hi
            labels = " ".join(self.run.builds[i].label for i in res.candidates)
            return [f"first bad commit: unknown (nightlies between could not be tested; it is one of {labels})",
                    f"last good commit: {self.commits['last_good'].text()}"]
        return [f"{name.replace('_', ' ')} commit: {self.commits[name].text()}" for name in ("first_bad", "last_good")]

    @property
    def outcome(self) -> Outcome:
        return self.run.result.outcome

    def summary(self) -> str:
        """The bisection of nightlies, what they were built from, the main range, the in-day answer."""
        return self.run.summary(extra=self.extra_lines(), tail=self.last_lines())

    def to_dict(self) -> dict:
        """The bisection's JSON, with the days, the commits, the main range and the in-day answer."""
        n = self.nightlies
        return {**self.run.to_dict(), "mode": "nightly", "package": n.package, "days": [str(d) for d in n.days],
                "missing_days": [str(d) for d in n.missing], "notes": n.notes,
                "first_bad_commit": self.commits["first_bad"].sha if "first_bad" in self.commits else None,
                "last_good_commit": self.commits["last_good"].sha if "last_good" in self.commits else None,
                "git_version_source": {k: v.where for k, v in self.commits.items()},
                "main_range": self.main.to_dict() if self.main else None,
                "inside_the_day": self.inside.to_dict() if self.inside is not None else None,
                "inside_the_day_not_run": self.inside_why}


def bisect_nightlies(*, good: str, bad: str, selection: Optional[Selection] = None, package: Optional[str] = None,
                     versions: Sequence[str] = (), index: Optional[IndexOptions] = None,
                     inherit: Optional[bool] = None, pytorch_repo: Optional[str] = None, rerun: bool = False,
                     eval_timeout: float = EVAL_TIMEOUT_S, store: Optional[Path] = None, strict: bool = False,
                     on_path: Sequence[str] = (), installer: str = "auto",
                     log: Callable[[str], None] = lambda s: None) -> NightlyBisection:
    """Bisect the nightlies from day (or version) ``good`` to ``bad``; see the module docstring."""
    selection = selection or Selection()
    repo = Checkout(pytorch_repo, "--pytorch-repo") if pytorch_repo else None
    index = index or IndexOptions()
    pkg = parse_end(good, "--good").package or parse_end(bad, "--bad").package or package or "torch"
    found = list(versions) or available_versions(pkg, replace(index, pre=True))
    nightlies = nightly_range(good, bad, found, package)
    for note in nightlies.notes:
        log(note)
    if nightlies.missing:
        log(f"no nightly of {nightlies.package} on {_days_text(nightlies.missing)}: skipped")
    run = bisect_releases(nightlies.builds, selection=selection, package=nightlies.package, index=index,
                          inherit=inherit, rerun=rerun, eval_timeout=eval_timeout, store=store, installer=installer,
                          log=log)
    res, commits, main, inside, why = run.result, {}, None, None, None
    if res.outcome in (Outcome.FOUND, Outcome.AMBIGUOUS):
        commits = {name: git_version(nightlies.package, run.evaluations.get(i))
                   for name, i in (("last_good", res.last_good), ("first_bad", res.first_bad))}
        good_sha, bad_sha = commits["last_good"].sha, commits["first_bad"].sha
        if repo is not None and good_sha and bad_sha:
            main = main_range(repo, good_sha, bad_sha)
    if main and not main.why and nightlies.package == "torch" and res.outcome is Outcome.FOUND:
        inside, why = into_the_day(run, repo, main, selection, strict=strict, on_path=on_path, rerun=rerun,
                                   eval_timeout=eval_timeout, store=store, log=log)
    return NightlyBisection(run, nightlies, selection, repo, commits, main, inside, why)


def into_the_day(run: BisectRun, repo: Checkout, main: MainRange, selection: Selection, *, strict: bool,
                 on_path: Sequence[str], rerun: bool, eval_timeout: float, store: Optional[Path],
                 log: Callable[[str], None]) -> tuple[Optional[Answer], Optional[str]]:
    """Bisect the main commits between the last good and the first bad nightly as overlays on the two:
    the in-day answer, or why there is none."""
    res = run.result
    pythons = [run.evaluations[i].python for i in (res.last_good, res.first_bad)]
    if not all(p and Path(p).exists() for p in pythons):
        return None, "a nightly's environment is gone: bisect again with --rerun"
    if main.commits < 2:
        return None, f"{main.commits} main commit between the two nightlies: nothing to bisect"
    log(f"inside the day: {main.commits} main commits from {main.good_main[:12]} to {main.bad_main[:12]}")
    try:
        return bisect_commits(
            checkout=repo.path, good=main.good_main, bad=main.bad_main, selection=selection,
            binaries=[f"{pythons[0]}={main.good_main}", f"{pythons[1]}={main.bad_main}"], strict=strict,
            on_path=on_path, rerun=rerun, eval_timeout=eval_timeout, store=store, log=log), None
    except UsageError as exc:
        return None, str(exc)
