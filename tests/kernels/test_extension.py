"""Building and caching the reference extension, and its failures."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from harness import kernels
from harness.errors import KernelBuildError
from harness.kernels import extension


@pytest.fixture
def copied_sources(tmp_path, monkeypatch):
    """The kernel sources copied to tmp_path and used from there (so a test may edit them)."""
    src = Path(kernels.__file__).parent
    dst = tmp_path / "kernels"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    monkeypatch.setattr(kernels, "SCHEMA_SOURCES", [dst / "ops.cpp"])
    monkeypatch.setattr(kernels, "CPU_SOURCES", sorted((dst / "cpu").glob("*.cpp")))
    monkeypatch.setattr(kernels, "CUDA_SOURCES", sorted((dst / "cuda").glob("*.cu")))
    monkeypatch.setattr(kernels, "HEADERS", sorted(dst.rglob("*.h")) + sorted(dst.rglob("*.cuh")))
    return dst


@pytest.fixture
def tiny_schema(tmp_path, monkeypatch):
    """A one-line source in place of the real schema source, which takes half a minute to compile."""
    tiny = tmp_path / "tiny.cpp"
    tiny.write_text("int syncbn_tiny() { return 0; }\n")
    monkeypatch.setattr(kernels, "SCHEMA_SOURCES", [tiny])


def key() -> str:
    return extension.BuildSpec(with_cuda=False, cuda_archs=None).key


def test_cache_key_depends_on_every_source_byte(copied_sources):
    before = key()
    cpu = copied_sources / "cpu" / "syncbn_cpu.cpp"
    cpu.write_text(cpu.read_text() + "\n// an edit that changes no name, only the contents\n")
    after_source = key()
    assert after_source != before, "an edited kernel would load the stale binary"
    header = copied_sources / "common.h"
    header.write_text(header.read_text() + "\n// edited\n")
    assert key() != after_source, "an edited header would load the stale binary"


def test_cache_key_depends_on_the_torch_build(monkeypatch):
    import torch

    before = key()
    monkeypatch.setattr(torch.version, "git_version", "0" * 40)
    assert key() != before
    monkeypatch.undo()
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    assert key() != before


def test_cache_key_depends_on_cuda_and_its_architectures():
    plain = key()
    cuda = extension.BuildSpec(with_cuda=True, cuda_archs="8.0;9.0")
    assert cuda.key != plain and any(p.suffix == ".cu" for p in cuda.sources)
    assert extension.BuildSpec(with_cuda=True, cuda_archs="9.0").key != cuda.key


def test_cache_directory_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("SYNCBN_HARNESS_CACHE", str(tmp_path))
    spec = extension.BuildSpec(with_cuda=False, cuda_archs=None)
    assert spec.directory == tmp_path / "kernels" / spec.key


def test_loading_again_costs_no_hashing(monkeypatch):
    """After the first load, load() returns the same library without building a spec (no source hashing)."""
    first = extension.load()

    def boom(*args, **kwargs):
        raise AssertionError("load() hashed the sources again")

    monkeypatch.setattr(extension, "build", boom)
    monkeypatch.setattr(extension.BuildSpec, "key", property(boom))
    assert extension.load() == first


def test_flags_are_not_probed_at_import():
    """Importing the module runs no compiler or torch probe (the flags are computed on first use)."""
    code = ("import sys, harness.kernels.extension as e; "
            "print(e.host_cflags.cache_info().currsize, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["0", "False"], out.stdout + out.stderr


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
    assert "cannot test" in proc.stderr and "no C++ compiler" in proc.stderr


def test_compile_error_names_the_cause_and_says_what_it_built(tmp_path, monkeypatch, capfd, tiny_schema):
    """A source that does not compile gives the compiler's message and the fix; the build announced itself.
    (The schema source is tiny: the real one would go on compiling for half a minute beside the error.)"""
    bad = tmp_path / "bad.cpp"
    bad.write_text("this is not C++;\n")
    monkeypatch.setenv("SYNCBN_HARNESS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(kernels, "CPU_SOURCES", [bad])
    with pytest.raises(KernelBuildError) as info:
        extension.build(extension.BuildSpec(with_cuda=False, cuda_archs=None))
    msg = str(info.value)
    assert "building the reference kernels failed" in msg and "build-kernels --verbose" in msg
    assert "bad.cpp" in msg and "error" in msg, msg  # the compiler's own message
    assert "building the reference kernels (CPU) for torch" in capfd.readouterr().err


def test_a_build_killed_midway_does_not_stall_the_next(tmp_path, monkeypatch, tiny_schema):
    """A builder killed mid-build leaves torch's ``lock`` file in the build folder, and torch waits for it to go,
    without a timeout. The next build removes it (it holds the key's own lock) and goes on: here to the compile
    error of a bad source, reached in seconds (the build runs in a thread, so that a regression fails instead of
    hanging the test)."""
    bad = tmp_path / "bad.cpp"
    bad.write_text("this is not C++;\n")
    monkeypatch.setenv("SYNCBN_HARNESS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(kernels, "CPU_SOURCES", [bad])
    spec = extension.BuildSpec(with_cuda=False, cuda_archs=None)
    spec.directory.mkdir(parents=True)
    (spec.directory / "lock").touch()  # what torch's builder leaves when it is killed
    outcome: list[BaseException] = []

    def build():
        try:
            extension.build(spec)
        except BaseException as exc:  # noqa: B036 (handed to the test's thread)
            outcome.append(exc)

    builder = threading.Thread(target=build, daemon=True)
    builder.start()
    builder.join(timeout=120)
    assert not builder.is_alive(), f"the build still waits for {spec.directory / 'lock'}"
    assert len(outcome) == 1 and isinstance(outcome[0], KernelBuildError), outcome
    assert "bad.cpp" in str(outcome[0]) and not (spec.directory / "lock").exists()


@pytest.mark.skipif(extension.find_cuda_home() is None, reason="no CUDA toolkit here (nvcc not found)")
def test_a_cuda_build_restores_cpp_extension_cuda_home(tmp_path, monkeypatch, tiny_schema):
    """The build points torch's cpp_extension at the real toolkit for its own use only, then puts it back."""
    import torch.utils.cpp_extension as cpp

    bad = tmp_path / "bad.cu"
    bad.write_text("this is not CUDA;\n")
    monkeypatch.setenv("SYNCBN_HARNESS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(kernels, "CPU_SOURCES", [])
    monkeypatch.setattr(kernels, "CUDA_SOURCES", [bad])
    sentinel = "/nonexistent/cuda-home-before-the-build"
    monkeypatch.setattr(cpp, "CUDA_HOME", sentinel)
    with pytest.raises(KernelBuildError):
        extension.build(extension.BuildSpec(with_cuda=True, cuda_archs="8.0"))
    assert cpp.CUDA_HOME == sentinel


def test_find_cuda_home_resolves_the_real_toolkit():
    home = extension.find_cuda_home()
    if home is None:
        assert shutil.which("nvcc") is None
    else:
        assert (home / "bin" / "nvcc").exists()
        assert not (home / "bin" / "nvcc").is_symlink() or (home / "bin").resolve() == home.resolve() / "bin"
