"""Virtual environments for builds, created once and cached.

``python -m venv --without-pip`` then pip (``pip --python ENV``) or uv
(``uv pip install --python ENV``, when it is on PATH or asked for:
:mod:`harness.bisect.installer`) installs into it. Two flavours:
- fresh (the default when bisecting torch): the build, then this harness with
  ``--no-deps`` (editable, from its source tree) plus its dependencies;
- inherit (the default for any other package): the environment sees this
  interpreter's packages *behind* its own (a ``.pth`` file adds them with
  ``site.addsitedir``), so torch and the harness come from here and only the
  bisected package is installed. pip never uninstalls what lies outside the
  environment, so this interpreter is left untouched.
An environment is ready once ``ready.json`` exists in it; a file lock per
environment makes concurrent bisections create it once. A failed install
raises :class:`InstallFailed` (the bisection counts that build as untestable).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from harness.bisect import children
from harness.bisect.builds import Build, IndexOptions, InstallFailed
from harness.bisect.installer import choose, install_command
from harness.paths import cache_folder

INSTALL_TIMEOUT_S = 3600.0  # CUDA releases pull several GB of dependencies
PROBE_TIMEOUT_S = 120.0
LOCK_TIMEOUT_S = INSTALL_TIMEOUT_S + 60




def harness_source_root() -> Optional[Path]:
    """The source tree this harness runs from (an editable or in-place install), or None."""
    import harness

    root = Path(harness.__file__).resolve().parent.parent
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and 'name = "syncbn-harness"' in pyproject.read_text():
        return root
    return None


def harness_requirements() -> list[str]:
    """The harness's own dependencies except torch (the build under test brings its own)."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        reqs = requires("syncbn-harness") or []
    except PackageNotFoundError:
        return ["click>=8.1", "filelock>=3.12", "ninja>=1.11", "setuptools<81"]
    out = []
    for r in reqs:
        spec, _, marker = r.partition(";")
        if "extra" in marker or re.split(r"[<>=!~ \[]", spec.strip())[0].lower() == "torch":
            continue
        out.append(spec.strip())
    # torch before 2.1 imports pkg_resources in torch.utils.cpp_extension (which builds the reference kernels);
    # setuptools 81 removed it, and a venv made --without-pip has no setuptools at all.
    out.append("setuptools<81")
    return out


def compat_pins(build: Build) -> list[str]:
    """What an older torch needs beside it that its own metadata does not say: torch before 2.3 was built
    against NumPy 1 and, beside NumPy 2 (which pandas brings), reports "Numpy is not available"."""
    from packaging.version import InvalidVersion, Version

    if build.kind != "release" or build.package != "torch":
        return []
    try:
        return ["numpy<2"] if Version(build.version).release[:2] < (2, 3) else []
    except InvalidVersion:
        return []


@dataclass
class EnvOptions:
    """How environments are made: inherit this interpreter's packages, and where pip looks."""

    inherit: bool = False
    index: IndexOptions = field(default_factory=IndexOptions)
    installer: str = "auto"  # pip, uv, or auto (uv when on PATH): harness.bisect.installer


def env_key(build: Build, opts: EnvOptions) -> str:
    """What makes an environment unique: the build, the interpreter, the flavour and the index."""
    ident = build.to_dict()
    if build.kind == "wheel":
        st = Path(build.path).stat()
        ident["wheel"] = [st.st_size, int(st.st_mtime)]
    parts = {"build": ident, "python": os.path.realpath(sys.executable), "py": sys.version.split()[0],
             "inherit": opts.inherit, "index": opts.index.pip_args(), "harness": str(harness_source_root())}
    if choose(opts.installer) == "uv":  # environments made by pip keep their keys
        parts["installer"] = "uv"
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def env_dir(build: Build, opts: EnvOptions) -> Path:
    """Where ``build``'s environment lives: ``cache_root()/envs/<label>-<key>``."""
    slug = re.sub(r"[^A-Za-z0-9._=-]+", "_", build.label if build.kind != "wheel" else Path(build.path).stem)
    return cache_folder("environments") / f"{slug[:60]}-{env_key(build, opts)}"


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
    _logged([sys.executable, "-m", "venv", "--without-pip", str(directory)], {}, logfile, PROBE_TIMEOUT_S)
    py = env_python(directory)
    if opts.inherit:
        purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=True).stdout.strip()
        lines = [f"import site; site.addsitedir({d!r})" for d in site.getsitepackages()]
        Path(purelib, "_syncbn_harness_inherit.pth").write_text("\n".join(lines) + "\n")
    installer = choose(opts.installer)
    target = build.path if build.kind == "wheel" else build.label
    if opts.inherit:
        _logged(*install_command(installer, py, [target], opts.index), logfile, INSTALL_TIMEOUT_S)
    else:
        root = harness_source_root()
        if root is None:
            raise InstallFailed("this harness is not installed from its source tree, so it cannot be put "
                                "into a fresh environment: install it with `pip install -e ROOT`, or use "
                                "--inherit")
        _logged(*install_command(installer, py, [target, *harness_requirements(), *compat_pins(build)], opts.index),
                logfile, INSTALL_TIMEOUT_S)
        _logged(*install_command(installer, py, ["--no-deps", "-e", str(root)], None), logfile, INSTALL_TIMEOUT_S)
    info = {"build": build.to_dict(), "inherit": opts.inherit, "installer": installer, "created_at": children.now(),
            "install_s": round(time.monotonic() - t0, 1), "install_log": str(logfile)}
    (directory / "ready.json").write_text(json.dumps(info, indent=2))
    log(f"  created {directory} in {info['install_s']}s")


def _logged(cmd: list[str], env: dict, logfile: Path, timeout: float) -> None:
    """Run ``cmd`` (with ``env`` added to the environment) into ``logfile``; :class:`InstallFailed` unless 0."""
    with open(logfile, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        try:
            code = children.run_group(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                                      env={**os.environ, **env} if env else None)
        except subprocess.TimeoutExpired:
            raise InstallFailed(f"`{' '.join(cmd[:8])} ...` took more than {timeout:.0f}s; see {logfile}") from None
    if code != 0:
        raise InstallFailed(f"`{' '.join(cmd)}` exited {code}: {children.tail(logfile.read_text(), 2)} "
                            f"(log: {logfile})")


