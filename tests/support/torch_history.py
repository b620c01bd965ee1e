"""Histories of a pytorch-shaped repository over the installed torch, for the overlay bisection tests.

The repository's base commit holds the installed torch's own ``batchnorm.py``, ``_functions.py``
and ``distributed.py`` (so an overlay of it is the installed torch itself); the planted Python
defect (:data:`PLANTED`) makes each rank's count in ``_functions.py`` its batch size, which
running_var's unbiasing gets wrong and ``--impl torch`` on CPU sees. Compiled files are stand-ins:
nothing compiles them, which is the point (an overlay leaves them out).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import torch

from harness.selection import Selection
from shared_kernels import cache_sharing_kernels

CASE = "allgather-shape/uneven-2-6/float32-float32/channels_last/ws2"
SELECTION = Selection(impls=("torch",), case_patterns=(CASE,), device="cpu", timeout=60)
TORCH = Path(torch.__file__).parent
FILES = ("torch/nn/modules/batchnorm.py", "torch/nn/modules/_functions.py", "torch/nn/parallel/distributed.py")
COUNT = "            count = torch.full(\n                (1,),\n                input.numel() // input.size(1),\n"
PLANTED = "            count = torch.full(\n                (1,),\n                input.size(0),\n"
NATIVE = "aten/src/ATen/native/Normalization.cpp"


def installed(rel: str) -> str:
    """The installed torch's text of ``rel`` (``torch/...``)."""
    return (TORCH.parent / rel).read_text()


def planted() -> str:
    """``_functions.py`` with the planted defect."""
    functions = installed(FILES[1])
    assert COUNT in functions, "the installed _functions.py no longer has the count the tests plant a defect in"
    return functions.replace(COUNT, PLANTED)


def base_files(**extra: str) -> dict:
    """The base commit's files: version.txt, the installed Python files, and ``extra``."""
    return {"version.txt": "2.13.0a0\n", "README.md": "t\n", **{rel: installed(rel) for rel in FILES}, **extra}


def harmless(rel: str, n: int) -> dict:
    """A comment added to an installed Python file (the ``n``-th such change)."""
    return {rel: installed(rel) + "".join(f"\n# harmless comment {k}\n" for k in range(n))}


def isolated_cache(tmp_path: Path, monkeypatch) -> None:
    """A cache of its own for overlays and verdicts; the reference kernels stay this torch build's, already built."""
    monkeypatch.setenv("SYNCBN_HARNESS_CACHE", str(cache_sharing_kernels(tmp_path / "cache")))


def kernels_for_renamed_builds(tmp_path: Path, builds) -> None:
    """After :func:`isolated_cache`: the test's cache gets kernels of its own, the installed torch's (linked)
    and, for each ``(version, git_version)`` in ``builds``, a copy of them under the key of the installed torch
    renamed so (a wheel of its files with another ``torch/version.py``, as test_nightly_torch's nightlies).

    Every compiled file of such a build is the installed torch's, so a build in its environment would compile
    the same sources against the same headers into the same library; only the version strings in the cache
    key differ. The copy spares each such environment that build (about 50 s of CPU on two cores), and the
    shared cache no longer gains a folder per run (the nightlies' commits, hence their keys, change each run)."""
    from unittest import mock

    from harness.kernels import extension

    library = extension.load()  # the installed torch's kernels, built in the shared cache (the kernels fixture)
    kernels = tmp_path / "cache" / "kernels"
    kernels.unlink()
    kernels.mkdir()
    (kernels / library.parent.name).symlink_to(library.parent, target_is_directory=True)
    for version, git_version in builds:
        with mock.patch.object(torch, "__version__", version), \
                mock.patch.object(torch.version, "git_version", git_version):
            spec = extension.default_spec()
            assert spec.key != library.parent.name  # the key is computed here, under the renamed versions
        spec.library.parent.mkdir()  # in the test's cache (SYNCBN_HARNESS_CACHE is set by isolated_cache)
        shutil.copyfile(library, spec.library)


def snapshot(root: Path) -> dict:
    """Every file under ``root``: size, mtime and (for .py) content hash."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            st = p.stat()
            out[str(p)] = (st.st_size, st.st_mtime_ns,
                           hashlib.sha256(p.read_bytes()).hexdigest() if p.suffix == ".py" else None)
    return out
