"""Builds to bisect over: specs, cached virtual environments, cached verdicts, and the driver.

A build SPEC is one of:
- a release ``PKG==VERSION`` (``torch==2.1.2``, ``mypkg==5``): pip installs it
  into a virtual environment cached under ``cache_root()/envs``;
- a wheel file path (``.../torch-2.13.0-...whl``): installed the same way;
- an existing interpreter (``/path/to/python``): used as it is.

Environments. ``python -m venv --without-pip`` then this interpreter's pip
(``pip --python ENV``) installs into it. Two flavours:
- fresh (the default when bisecting torch): the build, then this harness with
  ``--no-deps`` (editable, from its source tree) plus its dependencies;
- inherit (the default for any other package): the environment sees this
  interpreter's packages *behind* its own (a ``.pth`` file adds them with
  ``site.addsitedir``), so torch and the harness come from here and only the
  bisected package is installed. pip never uninstalls what lies outside the
  environment, so this interpreter is left untouched.
An environment is ready once ``ready.json`` exists in it; a file lock per
environment makes concurrent bisections create it once.

Verdicts. Each build is judged by ``ENV_PYTHON -m harness run --format json``
(records kept in a store under the cache) and the verdict is ``check``'s rule
over those records (:func:`verdict_of`). A verdict is cached under a key made
of the build's identity and the selection, so a second bisection over the
same range creates nothing and runs nothing. A build that cannot be tested
(install fails, ``run`` exits other than 0 or 1, nothing runnable) is a SKIP;
failed installs are not cached (they may be transient).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from harness import SCHEMA_VERSION, __version__
from harness.bisect import Bisector, Outcome, Result, Verdict
from harness.errors import HarnessError, UsageError
from harness.extension import cache_root

INSTALL_TIMEOUT_S = 3600.0  # CUDA releases pull several GB of dependencies
EVAL_TIMEOUT_S = 3600.0  # one `run` of the selection in one build
PROBE_TIMEOUT_S = 120.0
LOCK_TIMEOUT_S = INSTALL_TIMEOUT_S + 60
SCRUBBED_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "PYTHONHOME",
                "VIRTUAL_ENV", "TORCHELASTIC_RUN_ID")
_RELEASE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")


class InstallFailed(HarnessError):
    """A build could not be installed (the bisection treats it as untestable)."""


# ---------------------------------------------------------------------- specs


@dataclass(frozen=True)
class Build:
    """One build: ``kind`` is ``release``, ``wheel`` or ``python``; ``label`` is how it is shown."""

    kind: str
    label: str
    package: Optional[str] = None
    version: Optional[str] = None
    path: Optional[str] = None

    def to_dict(self) -> dict:
        return {"kind": self.kind, "label": self.label, "package": self.package, "version": self.version,
                "path": self.path}


def parse_spec(text: str, package: Optional[str] = None) -> Build:
    """A SPEC string as a :class:`Build`; a bare version means ``package==version``."""
    text = text.strip()
    m = _RELEASE.match(text)
    if m:
        return Build("release", text, package=m.group(1), version=m.group(2))
    p = Path(text).expanduser()
    if text.endswith(".whl"):
        if not p.is_file():
            raise UsageError(f"wheel {text!r} does not exist: give the path of a .whl file")
        name = p.name.split("-")[0].replace("_", "-")
        version = p.name.split("-")[1] if p.name.count("-") >= 4 else None
        return Build("wheel", text, package=name, version=version, path=str(p.resolve()))
    if os.sep in text or p.exists():
        if p.is_file() and os.access(p, os.X_OK):
            return Build("python", text, path=str(p.absolute()))
        raise UsageError(f"build {text!r} is not an executable interpreter: give /path/to/python, "
                         "a .whl file, or a release such as torch==2.1.2")
    if package and re.match(r"^[0-9][0-9A-Za-z.+!-]*$", text):
        return Build("release", f"{package}=={text}", package=package, version=text)
    raise UsageError(f"cannot read build {text!r}: use a release (torch==2.1.2), a wheel file path, "
                     "or an interpreter path (/path/to/python)")


@dataclass(frozen=True)
class IndexOptions:
    """Where pip looks for releases (default: pip's own configuration)."""

    find_links: tuple[str, ...] = ()
    index_url: Optional[str] = None
    extra_index_urls: tuple[str, ...] = ()
    no_index: bool = False
    pre: bool = False

    def pip_args(self) -> list[str]:
        args = []
        if self.no_index:
            args.append("--no-index")
        if self.index_url:
            args += ["--index-url", self.index_url]
        for url in self.extra_index_urls:
            args += ["--extra-index-url", url]
        for d in self.find_links:
            args += ["--find-links", str(Path(d).expanduser().resolve()) if Path(d).expanduser().exists() else d]
        if self.pre:
            args.append("--pre")
        return args


def available_versions(package: str, index: IndexOptions) -> list[str]:
    """Every release of ``package`` the configured index offers (``pip index versions``)."""
    cmd = [sys.executable, "-m", "pip", "index", "versions", package, *index.pip_args()]
    proc = _run(cmd, timeout=PROBE_TIMEOUT_S)
    for line in proc.stdout.splitlines():
        if line.startswith("Available versions:"):
            return [v.strip() for v in line.partition(":")[2].split(",") if v.strip()]
    raise UsageError(f"pip index versions {package} found no release ({_tail(proc.stderr, 3)}); "
                     "check the package name and --find-links/--index-url, or list them with --versions")


def release_range(package: str, good: str, bad: str, versions: Sequence[str]) -> list[Build]:
    """The releases from ``good`` to ``bad`` inclusive, in version order (reversed if good is newer)."""
    from packaging.version import Version

    by_public: dict = {}
    for v in versions:
        ver = Version(v)
        # torch 2.13.0 and 2.13.0+cpu are one release for a bisection: keep the plain one when both exist.
        key = ver.public
        if key not in by_public or by_public[key][1].local is not None:
            by_public[key] = (v, ver)
    for end in (good, bad):
        if Version(end).public not in by_public:
            by_public[Version(end).public] = (end, Version(end))
    ordered = sorted((t for t in by_public.values()), key=lambda t: t[1])
    labels = [v for v, _ in ordered]
    gi = next(i for i, (_, ver) in enumerate(ordered) if ver.public == Version(good).public)
    bi = next(i for i, (_, ver) in enumerate(ordered) if ver.public == Version(bad).public)
    if gi == bi:
        raise UsageError(f"--good and --bad are the same release {package}=={good}: give two releases")
    chosen = labels[gi:bi + 1] if gi < bi else list(reversed(labels[bi:gi + 1]))
    chosen[0], chosen[-1] = good, bad
    return [Build("release", f"{package}=={v}", package=package, version=v) for v in chosen]


def builds_from_file(path: str, package: Optional[str] = None) -> list[Build]:
    """SPECs one per line (``#`` starts a comment), oldest first."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise UsageError(f"--builds {path!r} cannot be read ({exc}): give a file of SPECs, one a line") from None
    return [parse_spec(ln.split("#", 1)[0], package) for ln in lines if ln.split("#", 1)[0].strip()]


def ordered_builds(good: str, bad: str, *, package: Optional[str] = None, versions: Sequence[str] = (),
                   builds_file: Optional[str] = None, index: IndexOptions = IndexOptions()) -> list[Build]:
    """The builds from good to bad, in order: from ``--builds``, ``--versions`` or the package index."""
    g, b = parse_spec(good, package), parse_spec(bad, package)
    if builds_file:
        listed = builds_from_file(builds_file, package)
        labels = [x.label for x in listed]
        for end, name in ((g, "--good"), (b, "--bad")):
            if end not in listed:
                raise UsageError(f"{name} {end.label!r} is not in --builds {builds_file}: "
                                 f"it lists {', '.join(labels)}")
        gi, bi = listed.index(g), listed.index(b)
        if gi == bi:
            raise UsageError(f"--good and --bad are the same build {g.label!r}")
        return listed[gi:bi + 1] if gi < bi else list(reversed(listed[bi:gi + 1]))
    if g.kind == b.kind == "release" and g.package == b.package:
        found = list(versions) or available_versions(g.package, index)
        return release_range(g.package, g.version, b.version, found)
    if g == b:
        raise UsageError(f"--good and --bad are the same build {g.label!r}")
    return [g, b]


# ---------------------------------------------------------------------- environments


def _harness_source_root() -> Optional[Path]:
    import harness

    root = Path(harness.__file__).resolve().parent.parent
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and 'name = "syncbn-harness"' in pyproject.read_text():
        return root
    return None


def _harness_requirements() -> list[str]:
    """The harness's own dependencies except torch (the build under test brings its own)."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        reqs = requires("syncbn-harness") or []
    except PackageNotFoundError:
        return ["click>=8.1", "filelock>=3.12", "ninja>=1.11"]
    out = []
    for r in reqs:
        spec, _, marker = r.partition(";")
        if "extra" in marker or re.split(r"[<>=!~ \[]", spec.strip())[0].lower() == "torch":
            continue
        out.append(spec.strip())
    return out


@dataclass
class EnvOptions:
    """How environments are made: inherit this interpreter's packages, and where pip looks."""

    inherit: bool = False
    index: IndexOptions = field(default_factory=IndexOptions)


def env_key(build: Build, opts: EnvOptions) -> str:
    """What makes an environment unique: the build, the interpreter, the flavour and the index."""
    ident = build.to_dict()
    if build.kind == "wheel":
        st = Path(build.path).stat()
        ident["wheel"] = [st.st_size, int(st.st_mtime)]
    parts = {"build": ident, "python": os.path.realpath(sys.executable), "py": sys.version.split()[0],
             "inherit": opts.inherit, "index": opts.index.pip_args(), "harness": str(_harness_source_root())}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def env_dir(build: Build, opts: EnvOptions) -> Path:
    """Where ``build``'s environment lives: ``cache_root()/envs/<label>-<key>``."""
    slug = re.sub(r"[^A-Za-z0-9._=-]+", "_", build.label if build.kind != "wheel" else Path(build.path).stem)
    return cache_root() / "envs" / f"{slug[:60]}-{env_key(build, opts)}"


def env_python(directory: Path) -> Path:
    """The interpreter of the environment in ``directory``."""
    return directory / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def ensure_env(build: Build, opts: EnvOptions, log: Callable[[str], None] = lambda s: None) -> tuple[Path, bool]:
    """The interpreter of ``build``'s environment, creating it if needed; second value: created now."""
    if build.kind == "python":
        return Path(build.path), False
    from filelock import FileLock, Timeout

    directory = env_dir(build, opts)
    directory.parent.mkdir(parents=True, exist_ok=True)
    try:
        with FileLock(str(directory) + ".lock").acquire(timeout=LOCK_TIMEOUT_S):
            if (directory / "ready.json").is_file():
                return env_python(directory), False
            _create_env(build, opts, directory, log)
            return env_python(directory), True
    except Timeout:
        raise InstallFailed(f"waited {LOCK_TIMEOUT_S:.0f}s for another process creating {directory}; "
                            f"if none is running, delete {directory}.lock") from None


def _create_env(build: Build, opts: EnvOptions, directory: Path, log: Callable[[str], None]) -> None:
    import shutil
    import site

    if directory.exists():
        shutil.rmtree(directory)  # a half-made environment from an interrupted run
    logfile = directory.parent / f"{directory.name}.install.log"
    t0 = time.monotonic()
    _logged([sys.executable, "-m", "venv", "--without-pip", str(directory)], logfile, PROBE_TIMEOUT_S)
    py = env_python(directory)
    if opts.inherit:
        purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=True).stdout.strip()
        lines = [f"import site; site.addsitedir({d!r})" for d in site.getsitepackages()]
        Path(purelib, "_syncbn_harness_inherit.pth").write_text("\n".join(lines) + "\n")
    pip = [sys.executable, "-m", "pip", "--python", str(py), "install", "--disable-pip-version-check"]
    target = build.path if build.kind == "wheel" else build.label
    if opts.inherit:
        _logged([*pip, target, *opts.index.pip_args()], logfile, INSTALL_TIMEOUT_S)
    else:
        root = _harness_source_root()
        if root is None:
            raise InstallFailed("this harness is not installed from its source tree, so it cannot be put "
                                "into a fresh environment: install it with `pip install -e ROOT`, or use "
                                "--inherit")
        _logged([*pip, target, *_harness_requirements(), *opts.index.pip_args()], logfile, INSTALL_TIMEOUT_S)
        _logged([*pip, "--no-deps", "-e", str(root)], logfile, INSTALL_TIMEOUT_S)
    info = {"build": build.to_dict(), "inherit": opts.inherit, "created_at": _now(),
            "install_s": round(time.monotonic() - t0, 1), "install_log": str(logfile)}
    (directory / "ready.json").write_text(json.dumps(info, indent=2))
    log(f"  created {directory} in {info['install_s']}s")


def _logged(cmd: list[str], logfile: Path, timeout: float) -> None:
    with open(logfile, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        try:
            code = _run_group(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise InstallFailed(f"`{' '.join(cmd[:8])} ...` took more than {timeout:.0f}s; see {logfile}") from None
    if code != 0:
        raise InstallFailed(f"`{' '.join(cmd)}` exited {code}: {_tail(logfile.read_text(), 2)} (log: {logfile})")


# ---------------------------------------------------------------------- verdicts


@dataclass
class Evaluation:
    """The verdict of one build and the records behind it."""

    verdict: Verdict
    reason: str
    records: list[dict] = field(default_factory=list)
    duration_s: float = 0.0
    cached: bool = False
    python: Optional[str] = None

    def to_dict(self) -> dict:
        return {"verdict": self.verdict.value, "reason": self.reason, "records": self.records,
                "duration_s": self.duration_s, "python": self.python}


def verdict_of(records: list[dict]) -> tuple[Verdict, str]:
    """``check``'s rule over ``run``'s records: bad on any unexpected failure, skip if nothing could run."""
    from harness.records import Record, Status

    recs = [Record.from_dict(r) for r in records]
    if not recs:
        return Verdict.SKIP, "nothing selected"
    runnable = [r for r in recs if r.status not in (Status.SKIPPED, Status.UNSUPPORTED)]
    if not runnable:
        return Verdict.SKIP, "every selected (case, impl) was skipped or unsupported: " + recs[0].message
    bad = [r for r in runnable if r.failed]
    if bad:
        return Verdict.BAD, f"{len(bad)} of {len(runnable)} failed; first: {bad[0].status.value} {bad[0].case} " \
                            f"[{bad[0].impl}] {bad[0].message}"
    return Verdict.GOOD, f"{len(runnable)} passed"


@dataclass(frozen=True)
class SelectionArgs:
    """The selection flags, passed on to ``run`` in each build."""

    impls: tuple[str, ...] = ()
    case_patterns: tuple[str, ...] = ()
    exhaustive: bool = False
    device: Optional[str] = None
    backend: Optional[str] = None
    world_sizes: tuple[int, ...] = ()
    timeout: Optional[float] = None

    def argv(self) -> list[str]:
        """The flags as ``run``/``check`` take them."""
        out = []
        for i in self.impls:
            out += ["--impl", i]
        for c in self.case_patterns:
            out += ["--case", c]
        if self.exhaustive:
            out.append("--exhaustive")
        if self.device:
            out += ["--device", self.device]
        if self.backend:
            out += ["--backend", self.backend]
        for w in self.world_sizes:
            out += ["--world-size", str(w)]
        if self.timeout:
            out += ["--timeout", str(self.timeout)]
        return out


def evaluate(python: Path, sel: SelectionArgs, store: Path, timeout: float = EVAL_TIMEOUT_S) -> Evaluation:
    """Run the selection with ``python -m harness run --format json`` and judge the records."""
    t0 = time.monotonic()
    cmd = [str(python), "-m", "harness", "run", "--format", "json", "--store", str(store), *sel.argv()]
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
    try:
        proc = _run(cmd, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return Evaluation(Verdict.SKIP, f"`run` took more than {timeout:.0f}s", duration_s=timeout,
                          python=str(python))
    duration = round(time.monotonic() - t0, 2)
    if "No module named harness" in proc.stderr:
        root = _harness_source_root() or "ROOT"
        return Evaluation(Verdict.SKIP, f"the harness is not installed in {python}: run "
                          f"`{python} -m pip install --no-deps -e {root}`", duration_s=duration, python=str(python))
    try:
        records = json.loads(proc.stdout) if proc.returncode in (0, 1) else None
    except json.JSONDecodeError:
        records = None
    if not isinstance(records, list):
        return Evaluation(Verdict.SKIP, f"`run` exited {proc.returncode}: {_tail(proc.stderr, 2)}",
                          duration_s=duration, python=str(python))
    verdict, reason = verdict_of(records)
    return Evaluation(verdict, reason, records, duration, python=str(python))


class VerdictCache:
    """One JSON file per (build identity, selection) under ``cache_root()/bisect/verdicts``."""

    def __init__(self, root: Optional[Path] = None):
        self.root = root or cache_root() / "bisect" / "verdicts"

    @staticmethod
    def key(build_id: str, sel: SelectionArgs) -> str:
        parts = {"build": build_id, "selection": sel.argv(), "harness": __version__, "schema": SCHEMA_VERSION}
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]

    def get(self, key: str) -> Optional[Evaluation]:
        try:
            d = json.loads((self.root / f"{key}.json").read_text())
        except (OSError, json.JSONDecodeError):
            return None
        return Evaluation(Verdict(d["verdict"]), d["reason"], d.get("records", []), d.get("duration_s", 0.0),
                          cached=True, python=d.get("python"))

    def put(self, key: str, build: Build, ev: Evaluation) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f"{key}.json.tmp{os.getpid()}"
        tmp.write_text(json.dumps({**ev.to_dict(), "build": build.to_dict(), "created_at": _now()}))
        os.replace(tmp, self.root / f"{key}.json")


def interpreter_fingerprint(python: Path) -> str:
    """An existing interpreter's identity: its path and every installed distribution's version."""
    code = ("import importlib.metadata as m, json, sys; print(json.dumps([sys.version, sorted("
            "(d.metadata['Name'] or '', d.version) for d in m.distributions())]))")
    try:
        proc = _run([str(python), "-c", code], timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"{python}:unknown"
    return hashlib.sha256(f"{os.path.realpath(python)}\0{proc.stdout}".encode()).hexdigest()[:16]


# ---------------------------------------------------------------------- the driver


@dataclass
class BisectRun:
    """A finished bisection: the builds, what each tested build said, and the result."""

    builds: list[Build]
    result: Result
    evaluations: dict[int, Evaluation]
    stats: dict

    def differing_records(self) -> list[dict]:
        """(case, impl) whose status differs between the last good and the first bad build."""
        if self.result.last_good is None or self.result.first_bad is None:
            return []
        good = {(r["case"], r["impl"]): r for r in self.evaluations[self.result.last_good].records}
        bad = {(r["case"], r["impl"]): r for r in self.evaluations[self.result.first_bad].records}
        out = []
        for key in sorted(set(good) | set(bad)):
            g, b = good.get(key), bad.get(key)
            gs, bs = (g or {}).get("status"), (b or {}).get("status")
            if gs != bs:
                out.append({"case": key[0], "impl": key[1],
                            "good": {"status": gs, "message": (g or {}).get("message", "")},
                            "bad": {"status": bs, "message": (b or {}).get("message", ""),
                                    "metrics": {k: m for k, m in (b or {}).get("metrics", {}).items()
                                                if isinstance(m, dict) and not m.get("ok", True)}}})
        return out

    def summary(self) -> str:
        """What a person reads at the end: the verdicts, the answer, and the records that differ."""
        lines = []
        for i, build in enumerate(self.builds):
            ev = self.evaluations.get(i)
            mark = f"{ev.verdict.value:<4}" + (" (cached)" if ev.cached else "") if ev else "-"
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
        lines.append(f"({self.stats['evaluated']} builds tested, {self.stats['cached']} verdicts from cache, "
                     f"{self.stats['envs_created']} environments created)")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"builds": [{**b.to_dict(), **({"verdict": self.evaluations[i].verdict.value,
                                               "reason": self.evaluations[i].reason,
                                               "cached": self.evaluations[i].cached}
                                              if i in self.evaluations else {"verdict": None})}
                           for i, b in enumerate(self.builds)],
                "result": self.result.to_dict(),
                "first_bad": self.builds[self.result.first_bad].label if self.result.first_bad is not None else None,
                "last_good": self.builds[self.result.last_good].label if self.result.last_good is not None else None,
                "differing": self.differing_records(), "stats": self.stats}


def bisect_builds(*, good: str, bad: str, package: Optional[str] = None, versions: Sequence[str] = (),
                  builds_file: Optional[str] = None, find_links: Sequence[str] = (), index_url: Optional[str] = None,
                  extra_index_urls: Sequence[str] = (), no_index: bool = False, pre: bool = False,
                  inherit: Optional[bool] = None, impls: Sequence[str] = (), case_patterns: Sequence[str] = (),
                  exhaustive: bool = False, device: Optional[str] = None, backend: Optional[str] = None,
                  world_sizes: Sequence[int] = (), timeout: Optional[float] = None, rerun: bool = False,
                  eval_timeout: float = EVAL_TIMEOUT_S, log: Callable[[str], None] = lambda s: None) -> BisectRun:
    """Bisect the builds from ``good`` to ``bad`` with the selection; see the module docstring."""
    index = IndexOptions(tuple(find_links), index_url, tuple(extra_index_urls), no_index, pre)
    builds = ordered_builds(good, bad, package=package, versions=versions, builds_file=builds_file, index=index)
    if case_patterns:
        from harness import catalog

        catalog.select(case_patterns, exhaustive=exhaustive, world_sizes=world_sizes)  # unknown patterns: usage
    pkg = package or builds[0].package or "torch"
    opts = EnvOptions(inherit=(pkg != "torch") if inherit is None else inherit, index=index)
    sel = SelectionArgs(tuple(impls), tuple(case_patterns), exhaustive, device, backend, tuple(world_sizes), timeout)
    cache = VerdictCache()
    stats = {"evaluated": 0, "cached": 0, "envs_created": 0}
    evaluations: dict[int, Evaluation] = {}
    log(f"bisecting {len(builds)} builds from {builds[0].label} (good) to {builds[-1].label} (bad)"
        + (", environments inherit this interpreter's packages" if opts.inherit else ""))

    def judge(i: int) -> Verdict:
        build = builds[i]
        build_id = (f"{build.kind}:{env_key(build, opts)}" if build.kind != "python"
                    else f"python:{interpreter_fingerprint(Path(build.path))}")
        key = cache.key(build_id, sel)
        ev = None if rerun else cache.get(key)
        if ev is not None:
            stats["cached"] += 1
            log(f"[{i + 1}/{len(builds)}] {build.label}: {ev.verdict.value} (cached) {ev.reason}")
        else:
            log(f"[{i + 1}/{len(builds)}] {build.label}: preparing")
            try:
                python, created = ensure_env(build, opts, log)
            except InstallFailed as exc:
                ev = Evaluation(Verdict.SKIP, f"install failed: {exc}")
            else:
                stats["envs_created"] += int(created)
                store = cache_root() / "bisect" / "stores" / build_id.replace(":", "-")
                ev = evaluate(python, sel, store, timeout=eval_timeout)
                cache.put(key, build, ev)
            stats["evaluated"] += 1
            log(f"[{i + 1}/{len(builds)}] {build.label}: {ev.verdict.value} in {ev.duration_s:.1f}s  {ev.reason}")
        evaluations[i] = ev
        return ev.verdict

    bisector = Bisector(len(builds))
    while (i := bisector.next_index()) is not None:
        bisector.feed(i, judge(i))
    return BisectRun(builds, bisector.result(), evaluations, stats)


# ---------------------------------------------------------------------- processes


def _run_group(cmd: list[str], *, timeout: float, **kw) -> int:
    """Run ``cmd`` in its own process group; on timeout kill the whole group, reap it and re-raise."""
    proc = subprocess.Popen(cmd, start_new_session=True, **kw)
    try:
        return proc.wait(timeout=timeout)
    except BaseException:
        _kill_group(proc)
        raise


def _run(cmd: list[str], *, timeout: float, env: Optional[dict] = None) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        _kill_group(proc)
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.communicate(timeout=10)
    except (subprocess.TimeoutExpired, ValueError):
        proc.kill()
        proc.wait(timeout=10)


def _tail(text: str, n: int) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip() and not ln.startswith("WARNING: Location")]
    return " | ".join(lines[-n:]) if lines else "no output"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
