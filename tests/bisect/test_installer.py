"""What installs builds into their environments: pip, or uv (a real ``uv pip install`` into a real environment)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.bisect.builds import Build, IndexOptions
from harness.bisect.envs import EnvOptions, ensure_env, env_key
from harness.bisect.installer import choose, install_command, uv_binary, uv_index_args
from harness.errors import UsageError

needs_uv = pytest.mark.skipif(uv_binary() is None, reason="uv is not installed (pip install uv, or '.[test]')")


def test_index_options_and_pips_configuration_become_uvs_flags(tmp_path):
    given = IndexOptions(find_links=(str(tmp_path),), extra_index_urls=("https://e.example/simple",), pre=True)
    assert uv_index_args(given, configured={"index-url": ["https://ignored.example"]}) == [
        "--index-strategy", "unsafe-best-match", "--prerelease", "allow", "--extra-index-url",
        "https://e.example/simple", "--find-links", str(tmp_path)]
    assert uv_index_args(IndexOptions(no_index=True, find_links=(str(tmp_path),)), configured={})[2:] == [
        "--no-index", "--find-links", str(tmp_path)]
    # Nothing given: pip's configuration, without the local folders that do not exist (pip ignores those).
    configured = {"find-links": [str(tmp_path), "/no/such/folder"],
                  "extra-index-url": ["file:///no/such/simple", "https://pypi.example/simple"]}
    assert uv_index_args(IndexOptions(), configured) == [
        "--index-strategy", "unsafe-best-match", "--extra-index-url", "https://pypi.example/simple",
        "--find-links", str(tmp_path)]
    cmd, env = install_command("pip", Path("/env/bin/python"), ["torch==2.13.0"], IndexOptions(pre=True))
    assert cmd[1:] == ["-m", "pip", "--python", "/env/bin/python", "install", "--disable-pip-version-check",
                       "--no-compile", "torch==2.13.0", "--pre"] and env == {}
    with pytest.raises(UsageError, match="choose among auto, pip, uv"):
        choose("conda")


@needs_uv
@pytest.mark.slow
def test_uv_makes_a_working_environment_with_its_cache_in_the_harness_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SYNCBN_HARNESS_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "src"
    (src / "uvplug").mkdir(parents=True)
    (src / "pyproject.toml").write_text(textwrap.dedent('''
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "uvplug"
        version = "3"
    '''))
    (src / "uvplug" / "__init__.py").write_text("VERSION = 3\n")
    wheels = tmp_path / "wheels"
    code = "import sys; from setuptools import build_meta; build_meta.build_wheel(sys.argv[1])"
    subprocess.run([sys.executable, "-c", code, str(wheels)], cwd=src, check=True, capture_output=True, timeout=300)
    build = Build("release", "uvplug==3", package="uvplug", version="3")
    index = IndexOptions(find_links=(str(wheels),), no_index=True)
    uv, pip = EnvOptions(inherit=True, index=index, installer="uv"), EnvOptions(inherit=True, index=index,
                                                                              installer="pip")
    assert env_key(build, uv) != env_key(build, pip)  # made differently: kept apart
    python, created = ensure_env(build, uv)
    assert created
    out = subprocess.run([str(python), "-c", "import uvplug, torch; print(uvplug.VERSION)"], capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.strip() == "3", out.stderr  # its own package, and this interpreter's behind it
    assert (tmp_path / "cache" / "uv").is_dir()
    log = next((tmp_path / "cache" / "envs").glob("*.install.log")).read_text()
    assert "uv pip install --python" in log.replace(uv_binary(), "uv")


def test_a_failed_install_keeps_what_uv_wraps_over_indented_lines():
    from harness.bisect.children import tail

    uv = ("Using Python 3.11.7 environment at: /tmp/env\n"
          "error: No solution found when resolving dependencies\n"
          "  cause: Because syncbnplug-no-such-dependency was not found in the\n"
          "         provided package locations and syncbnplug==2 depends on\n"
          "         syncbnplug-no-such-dependency>=1, we can conclude that syncbnplug==2\n"
          "         cannot be used.\n"
          "         And because you require syncbnplug==2, we can conclude that your\n"
          "         requirements are unsatisfiable.\n")
    last = tail(uv, 2)
    assert last.endswith("requirements are unsatisfiable.") and "syncbnplug-no-such-dependency>=1" in last
    pip = "WARNING: Location 'x' is ignored\nERROR: Could not find a version\nERROR: No matching distribution found\n"
    assert tail(pip, 2) == "ERROR: Could not find a version | ERROR: No matching distribution found"
    traceback = "Traceback (most recent call last):\n  File \"<string>\", line 1, in <module>\nImportError: no torch\n"
    assert tail(traceback, 1) == "ImportError: no torch"
