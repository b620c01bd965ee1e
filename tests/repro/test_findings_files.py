"""The findings files and what the docs say of them: every "exits N on ..." claim is a run, here or recorded.

Design: the claims are read where people read them (docs/findings.md, each file's docstring, each issue
body), in the one phrasing they may take: ``exits N on CPU`` or ``exits N on CUDA`` (this file, as it is
now), ``exited N on CUDA`` (an earlier version). A claim in findings.md belongs to the last findings file its
entry names before it (an entry: a heading's paragraphs, or one table row), or, in a sentence that says
"every <target> file", to each of that target's files.

- ``exits N on CPU``: the test runs the file here, as a maintainer would (``python FILE``, its own process
  group, a time limit), and checks its exit status and its verdict line. A file whose library this machine
  cannot install (apex is on no package index) is checked against a recorded CPU run instead.
- ``exits N on CUDA``: docs/findings/runs.toml has a run of this very file (its sha256) on CUDA with that exit.
- ``exited N on CUDA``: runs.toml has a run of some version of the file with that exit.

Besides: each recorded run's log ends as the record says; each findings file imports only the standard
library, torch and the one library it is about; each issue body embeds committed files byte for byte.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.gpu_suite.repros import ABSENT, CANNOT, LINES, SHOWS, imported_modules, judge

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "findings.md"
FINDINGS = ROOT / "docs" / "findings"
RUNS = FINDINGS / "runs.toml"
CLAIM = re.compile(r"\b(exits?|exited) ([0-2]) on (CPU|CUDA)\b")
EVERY = re.compile(r"\b[Ee]very\s+([a-z0-9]+)\s+(?:repro\s+)?file\b")  # "Every fairscale file exits 1 on CPU"
FILE = re.compile(r"\b([a-z0-9]+_[a-z0-9_]+\.py)\b")
LIBRARIES = {"torch", "fairscale", "detectron2_layers", "lightning", "apex"}
MAINTAINED = ("torch_", "lightning_")  # the files of maintained targets (docs/findings.md, "Who maintains what")
VERDICT = {code: line for line, code in LINES.values()}  # exit status -> the verdict line's start
TIMEOUT_S = 240


@dataclass(frozen=True)
class Claim:
    where: str  # the document and line
    file: str  # the findings file it is about
    past: bool  # "exited": an earlier version
    exit: int
    device: str  # "CPU" or "CUDA"


def _blocks(text: str):
    """findings.md's entries: (first line number, text), split at headings and table rows."""
    block, start = [], 1
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith(("#", "|")):
            if block:
                yield start, "\n".join(block)
            block, start = [line], n
            if line.startswith("|"):
                yield start, line
                block, start = [], n + 1
        else:
            block.append(line)
    if block:
        yield start, "\n".join(block)


def _claims_in(text: str, where: str, default: str = "") -> list[Claim]:
    out = []
    for m in CLAIM.finditer(text):
        before = text[:m.start()]
        sentence = re.split(r"(?<=[.;])\s", before)[-1]
        every = EVERY.search(sentence)
        named = FILE.findall(before)
        if every:  # every file of one target
            files = sorted(p.name for p in FINDINGS.glob(f"{every[1]}_*.py"))
        else:
            files = [named[-1] if named else default]
        line = f"{where}:{before.count(chr(10)) + 1}"
        out += [Claim(line, file, m[1] == "exited", int(m[2]), m[3]) for file in files]
    return out


def claims() -> list[Claim]:
    """Every claim of the docs, the files' docstrings and the issue bodies."""
    out = []
    for start, block in _blocks(DOC.read_text()):
        for c in _claims_in(block, "docs/findings.md"):
            out.append(Claim(f"docs/findings.md:{start + int(c.where.rsplit(':', 1)[1]) - 1}", c.file, c.past,
                             c.exit, c.device))
    for path in sorted(FINDINGS.glob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        out += [Claim(c.where, path.name, c.past, c.exit, c.device)  # a file's docstring speaks of itself
                for c in _claims_in(doc, f"docs/findings/{path.name}", default=path.name)]
    for path in sorted(FINDINGS.glob("*.md")):
        text = re.sub(r"```python\n.*?```", "", path.read_text(), flags=re.S)  # the embedded code's own claims
        out += _claims_in(text, f"docs/findings/{path.name}", default=path.stem + ".py")
    return out


def runs() -> list[dict]:
    return tomllib.loads(RUNS.read_text())["run"]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _libraries(path: Path) -> set[str]:
    """The top-level modules ``path`` imports beyond the standard library, torch included when it does."""
    return set(imported_modules(path)) | ({"torch"} if re.search(r"^import torch\b", path.read_text(), re.M) else set())


CLAIMS = claims()
CPU_NOW = sorted({c.file for c in CLAIMS if c.device == "CPU" and not c.past})


def test_every_claim_names_an_existing_file_and_the_claims_of_a_file_agree():
    assert CLAIMS, "no claim found: the phrasing changed?"
    for c in CLAIMS:
        assert (FINDINGS / c.file).is_file(), f"{c.where}: the claim is about {c.file!r}, which is not a findings file"
    said: dict = {}
    for c in CLAIMS:
        said.setdefault((c.file, c.device, c.past), set()).add(c.exit)
    split = {k: v for k, v in said.items() if len(v) > 1 and not k[2]}
    assert not split, f"one file, two exit statuses claimed: {split}"


def test_every_cuda_claim_is_a_recorded_run_of_that_file():
    recorded = runs()
    for c in (c for c in CLAIMS if c.device == "CUDA"):
        mine = [r for r in recorded if r["file"] == c.file and r["where"] == "cuda" and r["exit"] == c.exit]
        if not c.past:
            mine = [r for r in mine if r["sha256"] == sha256(FINDINGS / c.file)]
        assert mine, (f"{c.where}: '{'exited' if c.past else 'exits'} {c.exit} on CUDA' about {c.file}, and "
                      f"docs/findings/runs.toml has no such run" + ("" if c.past else " of the file as it is now"))


def test_every_recorded_run_has_its_log_and_the_log_ends_as_recorded():
    for r in runs():
        assert (FINDINGS / r["file"]).is_file() or r["where"] == "cuda", r
        log = ROOT / r["log"]
        assert log.is_file(), f"{r['file']}: the log {r['log']} is not in the repository"
        verdicts = [ln for ln in log.read_text().splitlines() if ln.startswith(tuple(VERDICT.values()))]
        assert verdicts and verdicts[-1] == r["line"], (r["file"], verdicts[-1:])
        assert r["line"].startswith(VERDICT[r["exit"]]), r


@pytest.mark.slow(20)
@pytest.mark.parametrize("name", CPU_NOW)
def test_a_cpu_claim_is_what_the_file_does_here(name, tmp_path):
    path = FINDINGS / name
    (claimed,) = {c.exit for c in CLAIMS if c.file == name and c.device == "CPU" and not c.past}
    missing = sorted(m for m in _libraries(path) if importlib.util.find_spec(m) is None)
    if missing:  # a library no package index has (apex): a recorded CPU run of this very file stands in
        recorded = [r for r in runs() if r["file"] == name and r["where"] == "cpu" and r["exit"] == claimed
                    and r["sha256"] == sha256(path)]
        assert recorded, f"{name} needs {', '.join(missing)}, not installed here, and no CPU run of it is recorded"
        pytest.skip(f"needs {', '.join(missing)}, which no package index has: checked against its run of "
                    f"{recorded[-1]['date']} ({recorded[-1]['log']})")
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["CUDA_VISIBLE_DEVICES"] = ""  # CPU, as claimed, also where a GPU is present
    env["PYTHONPATH"] = ""  # the file alone: nothing of the harness's test support on its path
    proc = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S, stdin=subprocess.DEVNULL, start_new_session=True)
    out = proc.stdout + proc.stderr
    verdict, line = judge(proc.returncode, out)
    assert proc.returncode == claimed, f"{name}: exit {proc.returncode}, claimed {claimed}: {line}\n{out[-3000:]}"
    assert verdict == {1: SHOWS, 0: ABSENT, 2: CANNOT}[claimed], (verdict, line)
    if claimed == 2:
        assert "needs a GPU" in line, f"{name}: exit 2 on CPU must say it needs a GPU: {line}"


def test_each_findings_file_needs_only_torch_and_its_library():
    for path in sorted(FINDINGS.glob("*.py")):
        libs = _libraries(path)
        assert "torch" in libs and libs <= LIBRARIES and len(libs - {"torch"}) <= 1, (path.name, libs)
        text = path.read_text()
        assert "/work/" not in text and "harness" not in libs, path.name


def test_each_issue_body_embeds_committed_files_byte_for_byte_and_every_maintained_file_has_one():
    """Bodies are ready to paste: the code in them is the committed file. Every file about maintained code (torch,
    Lightning: docs/findings.md's maintenance table) is in a body."""
    files = {p.name: p.read_text() for p in FINDINGS.glob("*.py")}
    embedded = set()
    for body in sorted(FINDINGS.glob("*.md")):
        for code in re.findall(r"```python\n(.*?)```", body.read_text(), flags=re.S):
            same = [n for n, text in files.items() if text == code]
            assert same, f"{body.name}: an embedded file is not a committed findings file byte for byte"
            embedded.update(same)
    maintained = {n for n in files if n.startswith(MAINTAINED)}
    assert maintained and not maintained - embedded, f"no issue body embeds {sorted(maintained - embedded)}"
