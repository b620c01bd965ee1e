"""`report` over a real store, checked in real headless Chromium; and the progress display of `run`.

The store holds real runs: a plugin (the reference, whose output an
environment variable can perturb) good and made worse, the latter filed
under a second build's key, and a probe that crashes rank 1 (tests/support).
"""

from __future__ import annotations

import csv
import os
import pty
import re
import shutil
import subprocess
import sys
import textwrap
import threading
from html.parser import HTMLParser
from pathlib import Path

import pytest
from cli_here import run_here

from harness.results.progress import Progress, format_counts, format_line, wanted
from harness.judge.status import WORST_FIRST, Status
from harness.results.records import Record
from harness.results.report import COLORS, SEVERITY
from harness.results.store import Store

SUPPORT = str(Path(__file__).resolve().parents[1] / "support")
PLUGIN = textwrap.dedent("""
    import os

    from harness.impls.reference import SyncBatchNorm


    class Drifting(SyncBatchNorm):
        def forward(self, input):
            out = super().forward(input)
            worse = float(os.environ.get("SYNCBN_TEST_WORSE", "0"))
            return out * (1.0 + worse) if worse else out
""")
KNOWN_CASE = "mixed-precision/empty-rank/float16-float32/ws2"  # torch crashes there, as a known issue
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def small_selection(n: int) -> list[str]:
    """IDs of ``n`` cheap default cases (float32, two ranks), read from the catalog as it is today."""
    from harness import catalog

    ids = [c.id for c in catalog.select(world_sizes=[2])
           if c.dtype == "float32" and c.param_dtype == "float32" and c.groups is None]
    assert len(ids) >= n, ids
    return ids[:n]


def harness_env(tmp: Path, **extra) -> dict:
    (tmp / "trplug.py").write_text(PLUGIN)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp), SUPPORT, os.environ.get("PYTHONPATH", "")]))
    env.update(extra)
    return env


def run(args, env, cwd=None):
    """The command run in this process (tests/support/cli_here.py): the fixtures' property is the records and
    the report, not the process; the terminal test below runs its own."""
    return run_here(args, env=env, cwd=cwd)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Two builds of the plugin (good, then worse under a fake key) and one crashing probe case."""
    tmp = tmp_path_factory.mktemp("report")
    cases = small_selection(3)
    sel = [a for c in cases for a in ("--case", c)]
    good = run(["run", "--impl", "trplug:Drifting", *sel, "--store", str(tmp / "store")], harness_env(tmp))
    assert good.returncode == 0, good.stderr[-3000:]
    assert "cases |" not in good.stderr and "\r" not in good.stderr, "progress drawn on a pipe"
    crash = run(["run", "--impl", "probes:SegfaultOnRank1", "--case", cases[0], "--store", str(tmp / "store")],
                harness_env(tmp))
    assert crash.returncode == 1, crash.stderr[-3000:]
    known = run(["run", "--impl", "torch", "--case", KNOWN_CASE, "--store", str(tmp / "store")], harness_env(tmp))
    assert known.returncode == 0 and "crash (known)" in known.stdout, known.stdout + known.stderr[-3000:]
    worse = run(["run", "--impl", "trplug:Drifting", *sel, "--store", str(tmp / "worse")],
                harness_env(tmp, SYNCBN_TEST_WORSE="0.01"))
    assert worse.returncode == 1, worse.stderr[-3000:]
    main = Store(tmp / "store")
    for r in Store(tmp / "worse").read():
        r.torch_version, r.torch_git_version = "9.9.9+worse", "feedfacefeedface"
        main.append(r)
    return tmp, cases


@pytest.fixture(scope="module")
def report(store):
    tmp, cases = store
    proc = run(["report", "--store", "store", "--out", "out", "--csv"], harness_env(tmp), cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    builds = Store(tmp / "store").builds()
    assert proc.stdout.split() == [str(Path("out") / f) for f in ("index.html", "summary.md")] + [
        str(Path("out") / "csv" / f"{b}.{kind}.csv") for b in builds for kind in ("records", "metrics")]
    return tmp / "out", cases


@pytest.mark.slow
def test_html_is_self_contained(report):
    out, _ = report
    page = (out / "index.html").read_text()
    assert not re.search(r"<(script|link)\b", page), "the page must not load scripts or stylesheets"
    assert not re.search(r"""\bsrc\s*=\s*['"](?!data:)""", page), "images must be inline data: URIs"
    assert not re.search(r"""<(?!a\b)[^>]*\bhref\s*=""", page), "only links to upstream issues (<a>) may point out"
    assert "@import" not in page and "url(" not in page
    assert page.count("src='data:image/png;base64,") == 1  # the plugin's; the crashes compared nothing
    assert "<p class='noplot'>" in page
    # The plot says how many of the compared tensors it shows, and why the others are not there.
    caption = re.search(r"<figcaption>(.*?)</figcaption>", page).group(1)
    assert re.match(r"\d+ of \d+ compared tensors plotted", caption), caption
    assert "known issue (expected failure)" in page  # the legend has the known colour


@pytest.mark.slow
def test_markdown_and_csv(report):
    out, cases = report
    md = (out / "summary.md").read_text()
    good_key = next(k for k in Store(out.parent / "store").builds() if not k.startswith("9.9.9"))
    assert "## trplug:Drifting" in md and "## probes:SegfaultOnRank1" in md
    assert f"| `{good_key}` |" in md and "| `9.9.9+worse-feedfacefeed-cpu-gloo` |" in md
    assert "## Failing cases (5, 1 of them known issues)" in md
    assert "| **3 mismatch** |" in md and "| **1 crash** |" in md
    assert "rank 1: crash SIGSEGV" in md
    # A known issue reads as one, not bold like a new failure, with its link.
    assert "| 1 crash (known) |" in md and "crash ([known](https://github.com/pytorch/pytorch/pull/74944))" in md
    rows = []
    for path in sorted((out / "csv").glob("*.records.csv")):  # one file per build
        with open(path, newline="") as f:
            rows += list(csv.DictReader(f))
    assert len(rows) == 8 and {r["status"] for r in rows} == {"pass", "mismatch", "crash"}
    assert {r["case"] for r in rows} == set(cases) | {KNOWN_CASE} and "param.dtype" in rows[0]
    assert [r["known_issue"] for r in rows if r["case"] == KNOWN_CASE] == ["True"]
    # What the ranks said, for the failing cases: each rank's collectives, the desync, a debug re-run.
    [known] = [r for r in rows if r["case"] == KNOWN_CASE]
    assert known["desync"].startswith("rank 0 all_gather float16[") and " vs rank 1 float32[" in known["desync"]
    assert known["collectives"].splitlines()[0].startswith("rank 0: step 0: all_gather float16[")
    assert known["diagnosis"] == "", "a known issue is not run again"
    [segv] = [r for r in rows if r["status"] == "crash" and r["impl"] == "probes:SegfaultOnRank1"]
    assert segv["diagnosis"], "an unexpected crash is run again with TORCH_DISTRIBUTED_DEBUG=DETAIL"
    assert all(r["collectives"] == "" for r in rows if r["status"] == "pass")
    page = (out / "index.html").read_text()
    assert page.count("<summary>collectives per rank</summary>") == 5


class _Dom(HTMLParser):
    """Elements of interest from a dumped DOM: matrix cells, failing rows, images."""

    def __init__(self):
        super().__init__()
        self.cells, self.rows, self.images, self._cell, self._row = [], [], [], None, None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "td" and "data-worst" in a:
            self._cell = dict(a, text="")
            self.cells.append(self._cell)
        elif tag == "tr" and "data-status" in a:
            self._row = dict(a, text="")
            self.rows.append(self._row)
        elif tag == "img":
            self.images.append(a)

    def handle_endtag(self, tag):
        if tag == "td":
            self._cell = None
        elif tag == "tr":
            self._row = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell["text"] += data
        if self._row is not None:
            self._row["text"] += data + " "


# Written into a copy of the page only: records what the browser decoded and painted.
PROBE = """<script>
window.addEventListener('load', () => {
  for (const img of document.images) {
    img.setAttribute('data-natural-width', img.naturalWidth);
    img.setAttribute('data-natural-height', img.naturalHeight);
  }
  for (const td of document.querySelectorAll('td.cell')) {
    td.setAttribute('data-bg', getComputedStyle(td).backgroundColor);
  }
  document.body.setAttribute('data-probed', 'yes');
});
</script>"""


def _rgb(hex_color: str) -> str:
    h = hex_color.lstrip("#")
    return "rgb({}, {}, {})".format(*(int(h[i:i + 2], 16) for i in (0, 2, 4)))


@pytest.mark.slow
def test_html_renders_in_headless_chromium(report, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium): the report's rendering is unchecked")
    out, cases = report
    probed = tmp_path / "probed.html"
    probed.write_text((out / "index.html").read_text().replace("</body>", PROBE + "</body>"))
    base = [chromium, *CHROMIUM_FLAGS, "--virtual-time-budget=10000"]
    dom = subprocess.run([*base, f"--user-data-dir={tmp_path / 'profile1'}", "--dump-dom", probed.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0 and "data-probed=\"yes\"" in dom.stdout, dom.stderr[-2000:]
    parsed = _Dom()
    parsed.feed(dom.stdout)

    matrix = {(c["data-build"][:5], c["data-family"], c["text"], c["data-worst"]) for c in parsed.cells
              if "data-build" in c}
    families = {c.split("/")[0] for c in cases}
    assert len(families) == 1, "the selection is one family"
    [family] = families
    good = next(k for k in Store(out.parent / "store").builds() if not k.startswith("9.9.9"))
    assert matrix == {(good[:5], family, "3 pass", "pass"), ("9.9.9", family, "3 mismatch", "mismatch"),
                      (good[:5], family, "1 crash", "crash"),
                      (good[:5], "mixed-precision", "1 crash (known)", "known")}
    for c in parsed.cells:
        if "data-build" in c:
            assert c["data-bg"] == _rgb(COLORS[c["data-worst"]]), c  # painted in its status color

    statuses = sorted(r["data-status"] for r in parsed.rows)
    assert statuses == ["crash", "crash", "mismatch", "mismatch", "mismatch"]
    known_row = next(r for r in parsed.rows if KNOWN_CASE in r["text"])
    assert "known issue" in known_row["text"]
    crash_row = next(r for r in parsed.rows if r["data-status"] == "crash" and KNOWN_CASE not in r["text"])
    assert "rank 1: crash SIGSEGV" in crash_row["text"] and "rank 0: peer-failed" in crash_row["text"]
    mismatch_row = next(r for r in parsed.rows if r["data-status"] == "mismatch")
    assert "9.9.9+worse" in mismatch_row["text"] and "output" in mismatch_row["text"]

    plots = [i for i in parsed.images if i.get("class") == "plot"]
    assert len(plots) == 1
    for img in plots:
        assert int(img["data-natural-width"]) > 300 and int(img["data-natural-height"]) > 200, img.get("alt")

    shot = tmp_path / "report.png"
    done = subprocess.run([*base, f"--user-data-dir={tmp_path / 'profile2'}", "--window-size=1280,2000",
                           f"--screenshot={shot}", (out / "index.html").as_uri()], capture_output=True, timeout=120)
    assert done.returncode == 0 and shot.stat().st_size > 10_000, done.stderr[-2000:]


# --- the progress display of `run` ------------------------------------------------------------------------------

def test_format_line_counts_elapsed_and_remaining():
    line = format_line(3, 10, {"pass": 2, "mismatch": 1}, elapsed=30.0)
    assert line.startswith("3/10 cases |")
    assert "pass 2  mismatch 1" in line
    assert "[00:30<01:10]" in line  # 10 s per case so far, 7 left
    assert format_line(0, 4, {}, elapsed=0.0).endswith("[00:00<?]")
    assert format_counts({"crash": 1, "pass": 5, "skipped": 0}) == "pass 5  crash 1"


def test_progress_is_quiet_off_a_terminal(tmp_path):
    with open(tmp_path / "err", "w+") as stream:
        assert not wanted(stream)
        rec = Record(case="numerics/a/ws2", family="numerics", params={}, impl="reference", status=Status.PASS)
        with Progress(3, enabled=wanted(stream), stream=stream) as bar:
            bar.update(rec)
            bar.write("mismatch   numerics/b/ws2  [reference]")
        assert bar.counts == {"pass": 1}
        stream.seek(0)
        assert stream.read() == "mismatch   numerics/b/ws2  [reference]\n"
    master, slave = pty.openpty()
    try:
        with os.fdopen(os.dup(slave), "w") as tty:
            assert wanted(tty) and not wanted(tty, "json")
    finally:
        os.close(master)
        os.close(slave)


def _run_on_a_tty(args, env) -> tuple[int, str, str]:
    """Run the harness with stderr on a pseudo-terminal; return (exit code, stdout, what the terminal got)."""
    master, slave = pty.openpty()
    chunks: list[bytes] = []

    def drain():
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        proc = subprocess.run([sys.executable, "-m", "harness", *args], env=env, stdout=subprocess.PIPE,
                              stderr=slave, timeout=600)
    finally:
        os.close(slave)
    reader.join(timeout=30)
    os.close(master)
    return proc.returncode, proc.stdout.decode(), b"".join(chunks).decode(errors="replace")


@pytest.mark.slow(60)
def test_run_draws_progress_on_a_terminal_but_not_with_json(tmp_path):
    cases = small_selection(2)
    sel = ["--impl", "reference", *[a for c in cases for a in ("--case", c)], "--store", str(tmp_path / "s")]
    code, out, term = _run_on_a_tty(["run", *sel], harness_env(tmp_path))
    assert code == 0, term[-3000:]
    assert re.search(r"2/2 cases \|.*\| pass 2\s+\[\d\d:\d\d<00:00\]", term), term[-2000:]
    assert "2 records: 2 pass" in out

    code, out, term = _run_on_a_tty(["run", *sel, "--format", "json"], harness_env(tmp_path))
    assert code == 0 and out.lstrip().startswith("[")
    assert "cases |" not in term, term[-2000:]


def test_every_status_has_an_order_and_a_color():
    assert sorted(WORST_FIRST, key=str) == sorted(Status, key=str) and len(WORST_FIRST) == len(Status)
    assert set(COLORS) == set(SEVERITY)
