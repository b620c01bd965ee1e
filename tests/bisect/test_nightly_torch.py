"""A date bisection of torch nightlies that goes on inside the day, over the two nightlies as binaries.

The nightlies are real torch wheels made from the installed torch (``torch-2.13.0.dev2026100N+cpu``):
its files, with each day's ``torch/version.py`` (the nightly's version, and the ``nightly`` branch
commit it was built from as ``git_version``) and that day's main commit's Python files. Between the
two days, the main branch of the pytorch-shaped repository holds, in order: a harmless Python change,
a change to ``aten/src/ATen/native/Normalization.cpp`` (on SyncBN's path; the second nightly is built
after it), the planted Python defect, and a harmless change (the second nightly's main commit).

By default the bad end's Python, laid over the first nightly, fails: the culprit is Python, and the
commits are bisected over that nightly (the compiled change left out, and said so). With ``--strict``
nothing compiled may differ: each commit lies over the nightly whose compiled diff from it is smaller,
so the day splits into two testable stretches instead of ending at the C++ change. Both name the
planted commit.
"""

from __future__ import annotations

import base64
import hashlib
import math
import os
import re
import zipfile
from pathlib import Path

import pytest

from harness.bisect.bisector import Outcome
from harness.bisect.builds import IndexOptions
from harness.bisect.nightly import bisect_nightlies
from pytorch_repo import PytorchRepo
from torch_history import (FILES, SELECTION, TORCH, base_files, harmless, installed, isolated_cache,
                           kernels_for_renamed_builds, planted)

NORMALIZATION = "aten/src/ATen/native/Normalization.cpp"


def make_repo(path: Path) -> tuple[PytorchRepo, list[str], dict]:
    """Main commits, and the two days' nightly-release commits (day -> sha)."""
    repo = PytorchRepo(path)
    main = [repo.commit("base", base_files(**{NORMALIZATION: "// n\n"})),
            repo.commit("nn: comment in batchnorm.py", harmless(FILES[0], 1)),
            repo.commit("aten: batch_norm_stats", {NORMALIZATION: "// n2\n"}),
            repo.commit("SyncBatchNorm: count per rank", {FILES[1]: planted()}),
            repo.commit("DDP: comment in distributed.py", harmless(FILES[2], 1))]
    nightly = {"2026-10-01": repo.nightly("2026-10-01", main[0]), "2026-10-02": repo.nightly("2026-10-02", main[-1])}
    return repo, main, nightly


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def torch_wheel(dest: Path, version: str, git_version: str, python_files: dict[str, str]) -> Path:
    """The installed torch as the wheel ``torch==version``, with ``python_files`` (``torch/...``) replaced."""
    info = f"torch-{version}.dist-info"
    path = dest / f"torch-{version}-py3-none-any.whl"
    own = re.sub(r"(?m)^__version__ = .*$", f"__version__ = {version!r}", installed("torch/version.py"))
    own = re.sub(r"(?m)^git_version = .*$", f"git_version = {git_version!r}", own)
    assert version in own and git_version in own
    replaced = {**python_files, "torch/version.py": own}
    record = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for root, dirs, files in os.walk(TORCH):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in files:
                rel = os.path.relpath(os.path.join(root, name), TORCH.parent)
                data = replaced[rel].encode() if rel in replaced else Path(root, name).read_bytes()
                z.writestr(rel, data)
                record.append(f"{rel},{_record_hash(data)},{len(data)}")
        meta = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
                f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: py3-none-any\n"}
        for rel, text in meta.items():
            z.writestr(rel, text)
            record.append(f"{rel},{_record_hash(text.encode())},{len(text)}")
        z.writestr(f"{info}/RECORD", "\n".join(record + [f"{info}/RECORD,,"]) + "\n")
    return path


@pytest.mark.sweep(141)
@pytest.mark.slow
def test_a_date_bisection_goes_inside_the_day_over_the_closer_nightly(tmp_path, monkeypatch, kernels):
    isolated_cache(tmp_path, monkeypatch)
    repo, main, nightly = make_repo(tmp_path / "pytorch")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    day_python = {main[0]: {}, main[-1]: {FILES[0]: harmless(FILES[0], 1)[FILES[0]], FILES[1]: planted(),
                                          FILES[2]: harmless(FILES[2], 1)[FILES[2]]}}
    builds = [(f"2.13.0.dev{day.replace('-', '')}+cpu", sha) for day, sha in nightly.items()]
    for (version, sha), commit in zip(builds, (main[0], main[-1])):
        torch_wheel(wheels, version, sha, day_python[commit])
    kernels_for_renamed_builds(tmp_path, builds)
    index = IndexOptions(find_links=(str(wheels),), no_index=True)

    got = bisect_nightlies(good="2026-10-01", bad="2026-10-02", selection=SELECTION, index=index, inherit=True,
                           pytorch_repo=str(repo.path))
    text = got.summary()
    assert got.run.result.outcome is Outcome.FOUND, text
    assert got.commits["last_good"][0] == nightly["2026-10-01"] and got.main.commits == 4, text
    inside = got.inside
    assert inside is not None, (got.inside_why, text)
    assert inside.kind == "python" and [t.base for t in inside.source.targets] == [main[0], main[-1]]
    assert text.splitlines()[-2:] == [f"first bad commit (Python): {main[3]}", f"last good commit: {main[2]}"], text
    # The compiled change is left out of the overlays after it, and said to be on SyncBN's path.
    assert "1 on SyncBN's path: aten/src/ATen/native/Normalization.cpp" in inside.approximate[3]
    assert inside.run.stats["evaluated"] <= math.ceil(math.log2(5)) + 3

    strict = bisect_nightlies(good="2026-10-01", bad="2026-10-02", selection=SELECTION, index=index, inherit=True,
                              pytorch_repo=str(repo.path), strict=True)
    text = strict.summary()
    plans = [strict.inside.source.plan(sha) for sha in main]
    assert [p.target.base for p in plans] == [main[0]] * 2 + [main[-1]] * 3, text
    assert not strict.inside.untestable and not strict.inside.approximate, text
    assert text.splitlines()[-2:] == [f"first bad commit (Python): {main[3]}", f"last good commit: {main[2]}"], text
    assert strict.run.stats["evaluated"] == 0  # the nightlies' verdicts came from the cache
