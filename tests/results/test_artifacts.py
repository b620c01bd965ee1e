"""Artifacts that always parse: JUnit XML whatever a message holds, and an HTML report that escapes every
value an implementation or a record brings (a message, an implementation's name, a case, a link)."""

from __future__ import annotations

import re
import xml.dom.minidom
import xml.etree.ElementTree as ET

from harness.results import junit
from harness.judge.status import RankOutcome, RankStatus, Status
from harness.results.records import Record
from harness.results.report import write_report
from harness.results.store import Store

HOSTILE = {"nul": "before\x00after", "ansi": "\x1b[31mred\x1b[0m text", "surrogate": "lone \ud800 surrogate",
           "controls": "bell\x07 backspace\x08 formfeed\x0c", "big": "x" * (1 << 20),
           "markup": "<script>alert(1)</script> & \"quotes\" 'too' ]]>"}


def record(name: str, message: str, impl: str = "plug:SyncBN", status: Status = Status.CRASH) -> Record:
    ranks = [RankOutcome(0, RankStatus.CRASH, signal="SIGSEGV", message=message, traceback=message),
             RankOutcome(1, RankStatus.PEER_FAILED)]
    return Record(case=f"module-config/{name}/ws2", family="module-config", params={"note": message[:100]},
                  impl=impl, status=status, message=message, ranks=ranks, torch_version="2.13.0+cpu",
                  torch_git_version="cf30153c4c131c8164ee7798e5022d810682e2cb", world_size=2)


def test_junit_holds_any_message_and_parses_strictly(tmp_path):
    records = [record(k, v) for k, v in HOSTILE.items()]
    records.append(record("error", "\x1b[1mboom\x00", status=Status.ERROR))
    records.append(record("skipped", "skip \ud83d reason", status=Status.SKIPPED))
    path = tmp_path / "junit.xml"
    junit.write(junit.run_rows(records), str(path))
    root = ET.parse(path).getroot()  # expat: strict XML 1.0
    xml.dom.minidom.parse(str(path))  # and a second parser
    assert root.get("tests") == str(len(records)) and root.get("failures") == str(len(HOSTILE))
    messages = {tc.get("name"): (tc[0].get("message"), tc[0].text) for tc in root.iter("testcase")}
    assert messages["module-config/nul/ws2"][0] == "before\\x00after"
    assert messages["module-config/ansi/ws2"][0] == "\\x1b[31mred\\x1b[0m text"
    assert messages["module-config/surrogate/ws2"][0] == "lone \\ud800 surrogate"
    assert messages["module-config/controls/ws2"][0] == "bell\\x07 backspace\\x08 formfeed\\x0c"
    assert messages["module-config/markup/ws2"][0] == HOSTILE["markup"]  # markup stays text, escaped by XML
    big, big_detail = messages["module-config/big/ws2"]
    assert len(big) < junit.MAX_MESSAGE + 100 and big.endswith("more characters; the store has the whole text)")
    assert len(big_detail) < junit.MAX_DETAIL + 100
    assert messages["module-config/error/ws2"][0] == "\\x1b[1mboom\\x00"
    assert messages["module-config/skipped/ws2"][0] == "skipped: skip \\ud83d reason"


def test_the_html_report_escapes_what_records_bring(tmp_path):
    store = Store(tmp_path / "store")
    for r in [record(k, v) for k, v in HOSTILE.items() if k != "big"]:
        store.append(r)
    store.append(record("impl", "ok", impl="<script>alert('impl')</script>", status=Status.MISMATCH))
    page = write_report(tmp_path / "store", tmp_path / "out").html.read_text()
    assert not re.search(r"<script", page, re.I), "a value from a record reached the page unescaped"
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "&lt;script&gt;alert(&#x27;impl&#x27;)" in page
    # Attributes are quoted values: no record text closes one.
    assert not re.search(r"data-impl='[^']*<", page)
