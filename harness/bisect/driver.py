"""The bisection driver: the ordered builds, the pure bisector, and a verdict for each build it asks about.

:func:`run_bisection` asks :func:`harness.bisect.bisector.run` to drive the
bisection over builds in order; each question is answered from the verdict
cache or by having the build *source* prepare the build and running the
selection in it (:class:`BuildTester`, :mod:`harness.bisect.verdicts`). A
source is a :class:`~harness.bisect.builds.BuildSource`: ``build_id`` (the
verdict cache key), ``prepare`` (a :class:`~harness.bisect.builds.Prepared`,
or :class:`~harness.bisect.builds.InstallFailed`: a SKIP, not cached, never an
abort), ``stat`` and ``noun`` (what it creates).

:class:`Environments` is the source of releases, wheels and interpreters (a
cached virtual environment each, :mod:`harness.bisect.envs`), which
:func:`bisect_builds` bisects; nightlies (:mod:`harness.bisect.nightly`) are
releases too, and commits laid over a binary are the overlay source
(:mod:`harness.bisect.overlay`). Verdicts known before any run (a commit an
overlay cannot test) are fed to the bisector up front and never asked about.

:class:`BisectRun` is the release bisection's answer (an
:class:`~harness.bisect.answers.Answer`); the other modes' answers render
their own lines around it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from harness.bisect import bisector
from harness.bisect.bisector import Outcome, Result, Verdict
from harness.bisect.builds import Build, BuildSource, IndexOptions, InstallFailed, Prepared, ordered_builds
from harness.bisect.envs import EnvOptions, ensure_env, env_key
from harness.bisect.verdicts import EVAL_TIMEOUT_S, Evaluation, VerdictCache, evaluate, interpreter_fingerprint
from harness.paths import cache_folder
from harness.selection import Selection


class Environments:
    """Releases, wheels and interpreters: a cached virtual environment per build (an interpreter as it is);
    a :class:`~harness.bisect.builds.BuildSource`."""

    stat, noun = "envs_created", "environments"

    def __init__(self, opts: EnvOptions):
        self.opts = opts

    def build_id(self, build: Build) -> str:
        """An interpreter's fingerprint, or the environment's key."""
        if build.kind == "python":
            return f"python:{interpreter_fingerprint(Path(build.path))}"
        return f"{build.kind}:{env_key(build, self.opts)}"

    def prepare(self, build: Build, log: Callable[[str], None]) -> Prepared:
        """The build's environment, made now or reused."""
        python, created = ensure_env(build, self.opts, log)
        return Prepared(python, created=created)


@dataclass
class BisectRun:
    """A finished bisection: the builds, what each tested build said, and the result; the release
    bisection's answer, and the body the other modes' answers render around."""

    builds: list[Build]
    result: Result
    evaluations: dict[int, Evaluation]
    stats: dict
    created: tuple[str, str] = ("envs_created", "environments")  # the source's stats key and noun
    marks: dict[int, str] = field(default_factory=dict)  # index -> a mark after the verdict (``~``: approximate)

    @property
    def outcome(self) -> Outcome:
        return self.result.outcome

    def last_lines(self) -> list[str]:
        """None: a release bisection's answer is in its body (``first bad: <build>``)."""
        return []

    def differing_records(self) -> list[dict]:
        """(case, impl) whose status differs between the last good and the first bad build."""
        if self.result.last_good is None or self.result.first_bad is None:
            return []
        good = {(r.case, r.impl): r for r in self.evaluations[self.result.last_good].records}
        bad = {(r.case, r.impl): r for r in self.evaluations[self.result.first_bad].records}
        out = []
        for key in sorted(set(good) | set(bad)):
            g, b = good.get(key), bad.get(key)
            gs, bs = (g.status.value if g else None), (b.status.value if b else None)
            if gs != bs:
                out.append({"case": key[0], "impl": key[1],
                            "good": {"status": gs, "message": g.message if g else ""},
                            "bad": {"status": bs, "message": b.message if b else "",
                                    "metrics": {k: m.to_dict() for k, m in (b.metrics if b else {}).items()
                                                if not m.ok}}})
        return out

    def summary(self, extra: Sequence[str] = (), tail: Sequence[str] = ()) -> str:
        """What a person reads at the end: the verdicts, the answer, the records that differ, ``extra``
        lines, the counts, then ``tail`` lines (a mode's last lines)."""
        lines = []
        for i, build in enumerate(self.builds):
            ev = self.evaluations.get(i)
            mark = (f"{ev.verdict.value + self.marks.get(i, ''):<4}" + (" (cached)" if ev.cached else "")
                    if ev else "-")
            reason = (ev.reason if len(ev.reason) < 160 else ev.reason[:157] + "...") if ev else ""
            lines.append(f"  {build.label:<40} {mark}" + (f"  {reason}" if ev and ev.verdict != Verdict.GOOD else ""))
        res = self.result
        if res.outcome is Outcome.GOOD_END_NOT_GOOD:
            ev = self.evaluations[0]
            lines.append(f"good end {self.builds[0].label} is not good ({ev.verdict.value}): {ev.reason}; "
                         "give a --good build that passes the selection")
        elif res.outcome is Outcome.BAD_END_NOT_BAD:
            ev = self.evaluations[len(self.builds) - 1]
            lines.append(f"bad end {self.builds[-1].label} is not bad ({ev.verdict.value}): {ev.reason}; "
                         "give a --bad build that fails the selection")
        else:
            lines.append(f"first bad: {self.builds[res.first_bad].label}")
            lines.append(f"last good: {self.builds[res.last_good].label}")
            if res.outcome is Outcome.AMBIGUOUS:
                lines.append("the builds between could not be tested; the first bad build is one of: "
                             + ", ".join(self.builds[i].label for i in res.candidates))
            diff = self.differing_records()
            lines.append(f"records that differ ({len(diff)}):" if diff else "no record differs in status")
            for d in diff:
                lines.append(f"  {d['case']} [{d['impl']}]: {d['good']['status']} -> {d['bad']['status']}  "
                             f"{d['bad']['message'][:300]}")
        lines.extend(extra)
        lines.append(self.counts())
        lines.extend(tail)
        return "\n".join(lines)

    def counts(self) -> str:
        """``(5 builds tested, 0 verdicts from cache, 5 overlays created)``."""
        return counts(self.stats, *self.created)

    def to_dict(self) -> dict:
        """The JSON answer: every build and its verdict, the result, the records that differ, the counts."""
        return {"builds": [{**b.to_dict(), **({"verdict": self.evaluations[i].verdict.value,
                                               "reason": self.evaluations[i].reason,
                                               "cached": self.evaluations[i].cached,
                                               "mark": self.marks.get(i)}
                                              if i in self.evaluations else {"verdict": None})}
                           for i, b in enumerate(self.builds)],
                "result": self.result.to_dict(),
                "first_bad": self.builds[self.result.first_bad].label if self.result.first_bad is not None else None,
                "last_good": self.builds[self.result.last_good].label if self.result.last_good is not None else None,
                "differing": self.differing_records(), "stats": self.stats}


def counts(stats: dict, key: str, noun: str) -> str:
    """``(5 builds tested, 0 verdicts from cache, 5 overlays created)`` of a :class:`BuildTester`'s stats."""
    return f"({stats['evaluated']} builds tested, {stats['cached']} verdicts from cache, {stats[key]} {noun} created)"


def bisect_builds(*, good: str, bad: str, selection: Optional[Selection] = None, package: Optional[str] = None,
                  versions: Sequence[str] = (), builds_file: Optional[str] = None,
                  index: Optional[IndexOptions] = None, inherit: Optional[bool] = None, rerun: bool = False,
                  eval_timeout: float = EVAL_TIMEOUT_S, store: Optional[Path] = None, installer: str = "auto",
                  log: Callable[[str], None] = lambda s: None) -> BisectRun:
    """Bisect the builds from ``good`` to ``bad`` with the selection; see the module docstring."""
    selection = selection or Selection()
    index = index or IndexOptions()
    builds = ordered_builds(good, bad, package=package, versions=versions, builds_file=builds_file, index=index)
    return bisect_releases(builds, selection=selection, package=package, index=index, inherit=inherit, rerun=rerun,
                           eval_timeout=eval_timeout, store=store, installer=installer, log=log)


def bisect_releases(builds: list[Build], *, selection: Selection, package: Optional[str], index: IndexOptions,
                    inherit: Optional[bool] = None, rerun: bool = False, eval_timeout: float = EVAL_TIMEOUT_S,
                    store: Optional[Path] = None, installer: str = "auto",
                    log: Callable[[str], None] = lambda s: None) -> BisectRun:
    """Bisect builds already in order (releases, wheels, interpreters), each in its cached environment.

    Environments inherit this interpreter's packages unless the bisected package is torch (``inherit``
    overrides).
    """
    pkg = package or builds[0].package or "torch"
    opts = EnvOptions(inherit=(pkg != "torch") if inherit is None else inherit, index=index, installer=installer)
    log(f"bisecting {len(builds)} builds from {builds[0].label} (good) to {builds[-1].label} (bad)"
        + (", environments inherit this interpreter's packages" if opts.inherit else ""))
    return run_bisection(builds, selection, Environments(opts), rerun=rerun, eval_timeout=eval_timeout,
                         store=store, log=log)


class BuildTester:
    """Verdicts of builds from one source: from the verdict cache, or by preparing the build and running
    the selection in it; counts what it did in :attr:`stats`."""

    def __init__(self, selection: Selection, source: BuildSource, *, rerun: bool = False,
                 eval_timeout: float = EVAL_TIMEOUT_S, store: Optional[Path] = None,
                 log: Callable[[str], None] = lambda s: None):
        self.selection, self.source, self.rerun, self.eval_timeout = selection, source, rerun, eval_timeout
        self.store, self.log = store, log
        self.cache = VerdictCache()
        self.stats = {"evaluated": 0, "cached": 0, source.stat: 0}

    def __call__(self, build: Build, label: str) -> Evaluation:
        """The verdict of ``build``; ``label`` prefixes the log lines (``[3/8] <build>``)."""
        build_id = self.source.build_id(build)
        key = self.cache.key(build_id, self.selection)
        ev = None if self.rerun else self.cache.get(key)
        if ev is not None:
            self.stats["cached"] += 1
            self.log(f"{label}: {ev.verdict.value} (cached) {ev.reason}")
            return ev
        self.log(f"{label}: preparing")
        try:
            ready = self.source.prepare(build, self.log)
        except InstallFailed as exc:
            ev = Evaluation(Verdict.SKIP, f"install failed: {exc}")
        else:
            self.stats[self.source.stat] += int(ready.created)
            where = self.store or cache_folder("bisect") / "stores" / build_id.replace(":", "-")
            ev = evaluate(ready.python, self.selection, Path(where).absolute(), timeout=self.eval_timeout,
                          extra_env=ready.env, cwd=ready.cwd)
            self.cache.put(key, build, ev)
        self.stats["evaluated"] += 1
        self.log(f"{label}: {ev.verdict.value} in {ev.duration_s:.1f}s  {ev.reason}")
        return ev


def run_bisection(builds: list[Build], selection: Selection, source: BuildSource, *, known: Optional[dict] = None,
                  rerun: bool = False, eval_timeout: float = EVAL_TIMEOUT_S, store: Optional[Path] = None,
                  log: Callable[[str], None] = lambda s: None, tester: Optional[BuildTester] = None) -> BisectRun:
    """Bisect ``builds`` (good end first) with the selection, each prepared by ``source``.

    ``known``: index -> :class:`Evaluation` settled before any run (fed to the bisector up front).
    ``store``: where every run's records go (default: one store per build under the cache).
    ``tester``: a :class:`BuildTester` that already answered questions (its counts carry on), else a new one.
    """
    if selection.case_patterns:
        selection.cases  # noqa: B018 - an unknown pattern is a usage error here, before any build is prepared
    tester = tester or BuildTester(selection, source, rerun=rerun, eval_timeout=eval_timeout, store=store, log=log)
    evaluations: dict[int, Evaluation] = dict(known or {})

    def ask(i: int) -> Verdict:
        evaluations[i] = tester(builds[i], f"[{i + 1}/{len(builds)}] {builds[i].label}")
        return evaluations[i].verdict

    machine = bisector.Bisector(len(builds))
    for i, ev in sorted(evaluations.items()):
        machine.feed(i, ev.verdict)
    result = bisector.run(machine, ask)
    return BisectRun(builds, result, evaluations, tester.stats, created=(source.stat, source.noun))
