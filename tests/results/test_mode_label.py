"""A torch failure in a DDP case seen only in cpu-emulation is labelled so by every reader.

Under DDP on CPU, torch's adapter also skips DDP's refusal of CPU SyncBatchNorm, and says so in a note. The
note is kept apart from the mode: the record's mode is ``cpu-emulation`` exactly, so the report's confirmation
column, the search's findings summary and the repro's "seen" line all say "not yet confirmed on CUDA". The case
is a real DDP run (a known torch defect, pytorch#111138), through the CLI into a store, then the report.
"""

from __future__ import annotations

import json

import pytest
from cli_here import run_here

from harness import catalog
from harness.judge.mode import Mode
from harness.repro import seen_line
from harness.judge.status import Status
from harness.results.records import Record
from harness.search.explore import SearchResult
from harness.search.findings import markdown
from harness.search.rules import Finding

CASE = "ddp/cnn-adam/broadcast-buffers-False-default-checkpoint-rank0/float32/ws2"
NOTE = "DDP's CPU SyncBatchNorm check skipped"
UNCONFIRMED = "cpu-emulation, not yet confirmed on CUDA"


@pytest.fixture(scope="module")
def ddp_record(tmp_path_factory) -> tuple[Record, object]:
    store = tmp_path_factory.mktemp("store")
    proc = run_here(["run", "--impl", "torch", "--case", CASE, "--store", str(store), "--format", "json"])
    records = json.loads(proc.stdout)
    assert len(records) == 1, proc.stderr
    return Record.from_dict(records[0]), store


@pytest.mark.slow(12)
def test_the_mode_is_cpu_emulation_and_the_ddp_note_stands_beside_it(ddp_record):
    record, _ = ddp_record
    assert record.status is Status.MISMATCH, record.message
    assert record.mode is Mode.CPU_EMULATION and record.emulated
    assert record.mode_notes == (NOTE,)
    assert record.to_dict()["mode"] == "cpu-emulation"


@pytest.mark.slow(12)
def test_the_report_says_not_yet_confirmed_on_cuda(ddp_record, tmp_path):
    _, store = ddp_record
    proc = run_here(["report", "--store", str(store), "--out", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "index.html").read_text()
    assert CASE in page and UNCONFIRMED in page


@pytest.mark.slow(12)
def test_the_findings_and_the_repro_say_not_yet_confirmed_on_cuda(ddp_record):
    record, _ = ddp_record
    case = next(c for c in catalog.all_cases() if c.id == CASE)
    found = Finding(signature="ddp mismatch", impl="torch", known=False, original=case, original_record=record,
                    minimal=case, record=record, found_after=1, found_at_s=1.0)
    summary = markdown(SearchResult(seed=0, impls=["torch"], findings=[found]), "torch 2.13.0")
    assert "- seen in cpu-emulation, not yet confirmed on CUDA" in summary
    assert seen_line(record, case).endswith(f"; {UNCONFIRMED}")
