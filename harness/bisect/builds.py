"""Builds to bisect over: what a build SPEC is, and the ordered list of builds between two ends.

A build SPEC is one of:
- a release ``PKG==VERSION`` (``torch==2.1.2``, ``mypkg==5``): pip installs it
  into a virtual environment (:mod:`harness.bisect.envs`);
- a wheel file path (``.../torch-2.13.0-...whl``): installed the same way;
- an existing interpreter (``/path/to/python``): used as it is.

The builds between the ends come from ``--builds FILE`` (one SPEC a line),
``--versions``, or the package index (``pip index versions``, with pip's
index options passed on).

What makes a build runnable is its *source* (:class:`BuildSource`): the
releases' environments (:mod:`harness.bisect.driver`) or the overlays of a
checkout's commits (:mod:`harness.bisect.overlay`). Both hand back a
:class:`Prepared`; the driver asks nothing else of them.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Protocol, Sequence

from harness.bisect import children
from harness.errors import HarnessError, UsageError

PROBE_TIMEOUT_S = 120.0
_RELEASE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")


class InstallFailed(HarnessError):
    """A build could not be installed (the bisection treats it as untestable)."""



@dataclass(frozen=True)
class Build:
    """One build: ``kind`` is ``release``, ``wheel``, ``python`` or ``overlay``; ``label`` is how it is shown.

    An ``overlay`` build (:mod:`harness.bisect.overlay`) is a commit of the checkout at ``path``, ``commit``
    its full sha.
    """

    kind: str
    label: str
    package: Optional[str] = None
    version: Optional[str] = None
    path: Optional[str] = None
    commit: Optional[str] = None

    def to_dict(self) -> dict:
        d = {"kind": self.kind, "label": self.label, "package": self.package, "version": self.version,
             "path": self.path}
        if self.commit is not None:  # only when set: the environment keys of the other kinds stay as they were
            d["commit"] = self.commit
        return d


@dataclass
class Prepared:
    """A build ready to run: its interpreter, what to add to the environment, where to run; made now or not."""

    python: Path
    env: dict = field(default_factory=dict)
    cwd: Optional[Path] = None
    created: bool = False


class BuildSource(Protocol):
    """What makes builds of one kind runnable; the bisection driver asks it for nothing else.

    ``stat`` and ``noun``: the stats key and the words for what it creates (``overlays_created``,
    ``overlays``).
    """

    stat: str
    noun: str

    def build_id(self, build: Build) -> str:
        """The build's identity: the verdict cache's key."""
        ...

    def prepare(self, build: Build, log: Callable[[str], None]) -> Prepared:
        """The interpreter, extra environment and folder to run ``build`` in, made now or reused;
        :class:`InstallFailed` when it cannot be made (a SKIP, never cached: it may be transient)."""
        ...


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
    proc = children.run(cmd, timeout=PROBE_TIMEOUT_S)
    for line in proc.stdout.splitlines():
        if line.startswith("Available versions:"):
            return [v.strip() for v in line.partition(":")[2].split(",") if v.strip()]
    raise UsageError(f"pip index versions {package} found no release ({children.tail(proc.stderr, 3)}); "
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


