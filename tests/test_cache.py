"""``cache list`` and ``cache prune`` over a real cache folder, beside real processes that use or lock entries."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_here import run_here

from harness.cache import KINDS, entries, parse_age, parse_size, prune
from harness.errors import UsageError

DAY = 86400.0


def make(root: Path, rel: str, size: int, age_days: float) -> Path:
    path = root / rel
    path.mkdir(parents=True)
    (path / "blob").write_bytes(b"x" * size)
    t = time.time() - age_days * DAY
    for p in (path / "blob", path):
        os.utime(p, (t, t))
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("SYNCBN_HARNESS_CACHE", str(root))
    made = {"old-kernels": make(root, "kernels/aaaa", 4000, 40), "new-kernels": make(root, "kernels/bbbb", 2000, 1),
            "old-env": make(root, "envs/torch==2.12.0-1234", 8000, 60),
            "overlay": make(root, "overlays/binid-base/c0ffee", 1000, 50),
            "compile": make(root, "inductor/torch-2.13.0", 3000, 2)}
    (root / "kernels" / "aaaa.lock").touch()
    return root, made


def hold(code: str) -> subprocess.Popen:
    """A real process that does something to the cache, then says so and waits."""
    proc = subprocess.Popen([sys.executable, "-c", code + "\nprint('ready', flush=True)\nimport time; time.sleep(60)"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_list_gives_kinds_sizes_and_last_use(cache):
    root, made = cache
    listed = entries()
    assert [e.path for e in listed] == [made[k] for k in ("old-env", "overlay", "old-kernels", "compile",
                                                          "new-kernels")]  # oldest use first
    assert {e.kind for e in listed} == {"kernels", "environments", "overlays", "compile"}
    assert next(e for e in listed if e.path == made["old-env"]).bytes == 8000
    out = run_here(["cache", "list"])  # in this process (tests/support/cli_here.py)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[1].split()[:3] == ["kernels", "2", "5.9"]
    assert out.stdout.splitlines()[-1] == f"5 entries, 17.6 KB in {root}"


def test_prune_by_age_and_size_keeps_what_processes_use_or_lock(cache):
    root, made = cache
    assert [e.path for e in prune(older_than=30 * DAY, dry_run=True).removed] == [
        made["old-env"], made["overlay"], made["old-kernels"]]
    assert all(p.exists() for p in made.values())  # a dry run removes nothing
    in_env = hold(f"import os; os.chdir({str(made['old-env'])!r})")  # a bisection running in an environment
    mapped = hold(f"f = open({str(made['old-kernels'] / 'blob')!r}, 'rb')")  # a rank that loaded the kernels
    locker = hold(f"from filelock import FileLock; lock = FileLock({str(made['overlay'])!r} + '.lock')\n"
                  "lock.acquire()")  # an overlay being made
    try:
        done = prune(older_than=30 * DAY)
        assert done.removed == []
        why = {e.path: reason for e, reason in done.skipped}
        assert why[made["old-env"]] == f"in use by process {in_env.pid}"
        assert why[made["old-kernels"]] == f"in use by process {mapped.pid}"
        assert why[made["overlay"]] == "locked: being made"
    finally:
        for p in (in_env, mapped, locker):
            p.kill()
            p.wait(timeout=30)
    done = prune(older_than=30 * DAY)
    assert sorted(e.path for e in done.removed) == sorted([made["old-env"], made["overlay"], made["old-kernels"]])
    assert not made["old-env"].exists() and made["new-kernels"].exists()
    # Least recently used first, until the rest fits.
    done = prune(max_size=2500)
    assert [e.path for e in done.removed] == [made["compile"]] and made["new-kernels"].exists()
    assert [e.path for e in prune(kinds=["kernels"], max_size=0).removed] == [made["new-kernels"]]


def test_the_cli_knows_every_kind():
    from harness.cache import KINDS
    from harness.commands.cache import KIND_NAMES

    assert KIND_NAMES == tuple(KINDS)


def test_ages_sizes_and_kinds_are_checked():
    assert parse_age("30d") == 30 * DAY and parse_age("12h") == 43200 and parse_age("2w") == 14 * DAY
    assert parse_size("20G") == 20 * 1024 ** 3 and parse_size("500M") == 500 * 1024 ** 2 and parse_size("10") == 10
    for bad in ("30", "soon", "-1d"):
        with pytest.raises(UsageError, match="is not an age"):
            parse_age(bad)
    with pytest.raises(UsageError, match="is not a size"):
        parse_size("lots")
    with pytest.raises(UsageError, match="needs --older-than AGE or --max-size SIZE"):
        prune()
    with pytest.raises(UsageError, match="choose among kernels"):
        entries(["nope"])


def test_cache_folders_are_named_in_one_place():
    """Every module finds its cache folder through ``harness.paths.cache_folder``: a folder named elsewhere would
    be invisible to ``cache prune``."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    wrong = []
    for p in [*(root / "harness").rglob("*.py"), *(root / "kernels").rglob("*.py")]:
        if p.name == "paths.py" and p.parent.name == "harness":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.left, ast.Call)
                    and getattr(node.left.func, "id", None) == "cache_root"):
                wrong.append(f"{p.relative_to(root)}:{node.lineno}")
    assert not wrong, "cache_root() / <name> outside harness/paths.py (use cache_folder(kind)): " + ", ".join(wrong)


def test_every_cache_folder_has_its_depth():
    from harness.paths import CACHE_FOLDERS

    assert set(KINDS) == set(CACHE_FOLDERS)
