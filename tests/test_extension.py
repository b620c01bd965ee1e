"""Building and caching the reference extension, and its failures."""

from __future__ import annotations

import os
import subprocess
import sys

from harness import extension


def test_cache_key_depends_on_build_and_sources(tmp_path, monkeypatch):
    spec = extension.default_spec(cuda=False)
    again = extension.default_spec(cuda=False)
    assert spec.key == again.key
    assert spec.directory.name == spec.key
    monkeypatch.setenv("SYNCBN_HARNESS_CACHE", str(tmp_path))
    assert extension.cache_root() == tmp_path
    assert str(spec.directory).startswith(str(tmp_path))
    # A CUDA build of the same sources is a different binary.
    cuda_spec = extension.BuildSpec(with_cuda=True, cuda_archs="8.0;9.0")
    assert cuda_spec.key != spec.key
    assert any(p.suffix == ".cu" for p in cuda_spec.sources)


def test_cache_key_changes_with_torch_version(monkeypatch):
    import torch

    spec = extension.default_spec(cuda=False)
    before = spec.key
    monkeypatch.setattr(torch.version, "git_version", "0" * 40)
    assert spec.key != before


def test_missing_compiler_is_a_clear_error(tmp_path):
    env = dict(os.environ, SYNCBN_HARNESS_CACHE=str(tmp_path), CXX="/nonexistent/c++")
    proc = subprocess.run([sys.executable, "-m", "harness", "build-kernels"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 3, proc.stderr
    assert "no C++ compiler" in proc.stderr and "/nonexistent/c++" in proc.stderr and "apt-get install" in proc.stderr


def test_check_exits_125_when_kernels_cannot_build(tmp_path):
    env = dict(os.environ, SYNCBN_HARNESS_CACHE=str(tmp_path), CXX="/nonexistent/c++")
    proc = subprocess.run([sys.executable, "-m", "harness", "check", "--impl", "reference", "--case",
                           "allgather-shape/uneven-2-6/*"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 125, proc.stderr
    assert "cannot test" in proc.stderr


def test_compile_error_names_the_cause(tmp_path, monkeypatch):
    """A source that does not compile gives the compiler's message and the fix."""
    import pytest

    from harness import kernels
    from harness.errors import KernelBuildError

    bad = tmp_path / "bad.cpp"
    bad.write_text("#include <torch/library.h>\nthis is not C++;\n")
    monkeypatch.setenv("SYNCBN_HARNESS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(kernels, "CPU_SOURCES", [bad])
    with pytest.raises(KernelBuildError) as info:
        extension.build(extension.BuildSpec(with_cuda=False, cuda_archs=None))
    msg = str(info.value)
    assert "building the reference kernels failed" in msg and "build-kernels --verbose" in msg


def test_find_cuda_home_resolves_the_real_toolkit():
    home = extension.find_cuda_home()
    if home is None:
        import shutil

        assert shutil.which("nvcc") is None
    else:
        assert (home / "bin" / "nvcc").exists()
        assert not (home / "bin" / "nvcc").is_symlink() or (home / "bin").resolve() == home.resolve() / "bin"
