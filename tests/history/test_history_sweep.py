"""A history end to end over two real releases: an old CUDA build from the package index (2.0.1, before the
counts cast of pytorch#98332) and the current CPU build (2.13.0+cpu), each in a fresh environment pip makes,
the cases #98332 is about, then the page. It resumes, and it leaves no environment behind."""

from __future__ import annotations

import json

import pytest
from cli_here import run_here

from harness.history import fixes, table
from harness.paths import cache_folder

OLD, CURRENT = "2.0.1", "2.13.0+cpu"
CASES = ["allgather-shape/even-4-4/float16-float16/contiguous/ws2", "mixed-precision/uneven/bfloat16-bfloat16/ws2",
         "allgather-shape/even-4-4/float32-float32/contiguous/ws2"]


@pytest.mark.sweep(120)
def test_two_releases_end_to_end_show_the_counts_cast_at_its_release(tmp_path):
    store, out = tmp_path / "store", tmp_path / "page"
    argv = ["history", "--store", store, "--release", OLD, "--release", CURRENT, "--impl", "torch", "--installer",
            "pip", *(x for c in CASES for x in ("--case", c))]
    done = run_here(argv)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 of 2 releases stored" in done.stdout
    assert f"[1/2] torch=={OLD}: environment removed" in done.stderr
    manifest = json.loads((store / "history.json").read_text())["releases"]
    assert [manifest[r]["status"] for r in (OLD, CURRENT)] == ["stored", "stored"]
    assert manifest[OLD]["env_bytes"] > 2**30 and manifest[OLD]["counts"] == {"error": 2, "pass": 1}
    assert not [p for p in cache_folder("environments").glob("torch==*") if p.is_dir()
                and p.name.startswith((f"torch=={OLD}-", f"torch=={CURRENT}-"))]

    again = run_here(argv)
    assert again.returncode == 0 and again.stderr.count("stored already") == 2

    made = run_here(["report", "--history", store, "--out", out])
    assert made.returncode == 0, made.stderr
    history = table.read(out / "history.jsonl.gz")
    assert history.stored() == [OLD, CURRENT]
    [cast] = [c for c in fixes.load() if c.pr == 98332]
    got = fixes.check(cast, history)
    assert (got.expected, got.observed, got.cases, got.verdict) == (CURRENT, CURRENT, 2, "agrees")
    text = (out / "index.md").read_text()
    assert f"| {OLD} → {CURRENT} | torch | error → pass | 2 |" in text and "#98332" in text
    assert (out / "index.html").read_text().startswith("<!DOCTYPE html>")
