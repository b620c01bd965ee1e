"""Timelines: an overlay bisection's builds in their commits' order, whatever their keys sort to."""

from __future__ import annotations

from harness.results import timeline


def entry(sha: str, approximate=None) -> dict:
    return {"commit": sha, "label": sha[:12], "verdict": "good", "approximate": approximate, "untestable": None}


def test_builds_follow_the_branch_and_the_rest_follow_their_keys(tmp_path):
    shas = ["f" * 40, "a" * 40, "c" * 40]  # branch order; their keys sort a, c, f
    timeline.write(tmp_path, {"checkout": "/src/pytorch", "kind": "python", "commits": [entry(s) for s in shas]})
    (tmp_path / "timeline-broken-json.json").write_text("{not json")  # ignored, never fatal
    (tmp_path / "timeline-wrong-shape.json").write_text('{"commits": [{"sha": 1}]}')
    builds = [(f"2.13.0+cpu-{s[:12]}-on-b-cpu-gloo", f"overlay of {s} on {'b' * 40}") for s in shas]
    builds.append(("2.13.0+cpu-0123456789ab-cpu-gloo", "0123456789ab" + "0" * 28))  # not an overlay
    builds.append(("2.12.0+cpu-9999-cpu-gloo", "9999"))
    assert len(timeline.load(tmp_path)) == 1
    assert timeline.order(sorted(builds), timeline.load(tmp_path)) == [
        builds[0][0], builds[1][0], builds[2][0], "2.12.0+cpu-9999-cpu-gloo", "2.13.0+cpu-0123456789ab-cpu-gloo"]
    # Without a timeline, keys in order.
    assert timeline.order(builds, []) == sorted(k for k, _ in builds)
    # An approximate overlay is marked.
    gv = f"overlay of {shas[0]} on {'b' * 40} (approximate: 3 compiled files left out)"
    assert timeline.commit_of(gv) == shas[0]
    assert timeline.label("k", gv) == "k ~" and timeline.label("k", f"overlay of {shas[0]} on b") == "k"
    assert not list(tmp_path.glob(".timeline-*"))  # written aside, then renamed
