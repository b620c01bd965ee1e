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
    builds = [(f"2.13.0+cpu-{s[:12]}-on-b-cpu-gloo", s) for s in shas]  # (key, the overlaid commit)
    builds.append(("2.13.0+cpu-0123456789ab-cpu-gloo", None))  # not an overlay
    builds.append(("2.12.0+cpu-9999-cpu-gloo", None))
    assert len(timeline.load(tmp_path)) == 1
    assert timeline.order(sorted(builds), timeline.load(tmp_path)) == [
        builds[0][0], builds[1][0], builds[2][0], "2.12.0+cpu-9999-cpu-gloo", "2.13.0+cpu-0123456789ab-cpu-gloo"]
    # Without a timeline, keys in order.
    assert timeline.order(builds, []) == sorted(k for k, _ in builds)
    # An approximate overlay (compiled files left out) is marked.
    assert timeline.label("k", 3) == "k ~" and timeline.label("k", 0) == "k"
    assert not list(tmp_path.glob(".timeline-*"))  # written aside, then renamed


def test_a_report_orders_and_marks_builds_by_their_records_overlay_field(tmp_path):
    from harness.results.page import gather
    from harness.judge.status import Status
    from harness.results.records import Overlay, Record
    from harness.results.store import Store

    shas = ["f" * 40, "a" * 40]
    store = Store(tmp_path)
    for sha, left_out in zip(shas, (0, 2)):
        overlay = Overlay(sha, "b" * 40, left_out)
        store.append(Record(case="module-config/c/ws2", family="module-config", params={}, impl="torch",
                            status=Status.PASS, torch_version="2.13.0+cpu", torch_git_version=overlay.describe(),
                            overlay=overlay))
    timeline.write(tmp_path, {"checkout": "/src/pytorch", "kind": "python", "commits": [entry(s) for s in shas]})
    page = gather(tmp_path)
    assert timeline.rows(page.builds, tmp_path) == [(f"2.13.0+cpu-{'f' * 12}-on-{'b' * 12}-cpu-gloo",) * 2,
                                                    (f"2.13.0+cpu-{'a' * 12}-on-{'b' * 12}-cpu-gloo",
                                                     f"2.13.0+cpu-{'a' * 12}-on-{'b' * 12}-cpu-gloo ~")]
