"""Bad input, tried systematically (hypothesis): the store reader and its index, the known-issues file and case
globs. Each gives an error of the harness's own (a usage or store error naming the file, line or value, with
the fix), never a traceback, and no file is changed by reading it."""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from harness import catalog
from harness.errors import HarnessError
from harness.results import known_issues
from harness.judge.status import Status
from harness.results.records import Record
from harness.results.store import Store, read_file

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                 max_size=3), max_leaves=8)
FIELDS = ("case", "family", "params", "impl", "status", "message", "ranks", "metrics", "torch_version", "overlay",
          "world_size", "duration_s", "known_issue", "compare", "desync", "diagnosis", "compile", "schema_version")


def good(n: int) -> dict:
    d = Record(case=f"module-config/c{n}/ws2", family="module-config", params={}, impl="torch", status=Status.PASS,
               torch_version="2.13.0+cpu", torch_git_version="cf30153c4c131c8164ee7798e5022d810682e2cb").to_dict()
    return d


def harness_error_or_records(fn):
    """``fn()``'s records, or None when it raised an error of the harness's own (whose text we return)."""
    try:
        return fn(), None
    except HarnessError as exc:
        return None, str(exc)


@SETTINGS
@given(field=st.sampled_from(FIELDS), value=JSON, garbage=st.binary(max_size=40))
def test_the_store_reader_and_index_refuse_or_drop_bad_lines_never_crash(tmp_path, field, value, garbage):
    store = tmp_path / "store"
    store.mkdir(exist_ok=True)
    path = store / "2.13.0+cpu-cf30153c4c13-cpu-gloo.jsonl"
    bad = good(1)
    bad[field] = value
    data = b"".join((json.dumps(d) + "\n").encode() for d in (good(0), bad, good(2))) + garbage.replace(b"\n", b"")
    path.write_bytes(data)
    records, error = harness_error_or_records(lambda: read_file(path))
    if error is not None:
        assert str(path) in error, error
    else:
        assert {r.case for r in records} >= {"module-config/c0/ws2", "module-config/c2/ws2"}
    for index_file in store.glob(".syncbn-index*"):
        index_file.unlink()
    rows, error = harness_error_or_records(lambda: _latest(store))
    if error is not None:
        assert str(path) in error, error
    assert path.read_bytes() == data  # reading changes nothing


def _latest(store: Path) -> list:
    with Store(store) as asked:
        return list(asked.latest())


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return json.dumps(v)  # a basic TOML string is a JSON string


TOML_VALUES = st.one_of(st.text(max_size=15), st.integers(), st.booleans(),
                        st.lists(st.text(max_size=10) | st.integers(), max_size=3),
                        st.sampled_from(["torch", "*", ">=2", "crash", "not a specifier ~~", "mismatch"]))


@SETTINGS
@given(entries=st.lists(st.dictionaries(st.sampled_from(["impl", "cases", "torch", "status", "link", "note", "x"]),
                                        TOML_VALUES, max_size=7), max_size=3),
       junk=st.text(max_size=30))
def test_the_known_issues_file_names_what_is_wrong(tmp_path, entries, junk):
    path = tmp_path / "known_issues.toml"
    text = "".join("[[issue]]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in e.items()) for e in entries)
    for body in (text, text + junk):
        path.write_text(body)
        known_issues.load.cache_clear()
        loaded, error = harness_error_or_records(lambda: known_issues.load(str(path)))
        if error is not None:
            assert str(path) in error, error


@SETTINGS
@given(pattern=st.text(max_size=30))
@example(pattern="numerics/*").via("a glob of default cases")
@example(pattern="cuda-graph/*").via("a glob whose cases are all outside the default selection")
@example(pattern="no-such-family/*").via("a glob that matches nothing")
@example(pattern="")
def test_case_globs_select_or_say_what_exists(pattern):
    from harness.selection import Selection

    cases, error = harness_error_or_records(lambda: Selection(case_patterns=(pattern,)).cases)
    matching = [c.id for c in catalog.all_cases() if fnmatch.fnmatchcase(c.id, pattern)]
    if not matching:  # the one message: nothing in the catalog has such an ID
        assert error is not None and error.startswith(f"--case {pattern!r} matches no case: IDs start with one of "), \
            error
        assert error.endswith("(see `syncbn-harness list cases --exhaustive`)"), error
    elif error is not None:  # a glob whose every case is outside the default selection
        assert error.startswith(f"--case {pattern!r} matches only cases outside the default selection: add "
                                "--exhaustive"), error
    else:
        assert cases and all(fnmatch.fnmatchcase(c.id, pattern) for c in cases), pattern


def test_known_issues_errors_read_as_fixes(tmp_path):
    path = tmp_path / "k.toml"
    path.write_text('[[issue]]\nimpl = "torch"\ncases = "*"\ntorch = 5\nstatus = "crash"\nlink = "x"\n'
                    'symptoms = "crash *"\n')
    known_issues.load.cache_clear()
    with pytest.raises(HarnessError, match=r"issue #1 torch = 5: give a string \(a version specifier"):
        known_issues.load(str(path))


@SETTINGS
@given(spec=st.one_of(st.text(max_size=25), st.builds(lambda a, b: f"zz_nosuch{a}:{b}", st.text(max_size=8),
                                                      st.text(max_size=8))))
def test_plugin_specs_name_what_cannot_be_loaded(spec):
    from harness.impls.registry import builtin_names, resolve_impls

    if spec in builtin_names() or not spec.startswith("zz_nosuch") and ":" in spec:
        return  # a real adapter, or a module an arbitrary text might name: not imported from a property test
    impls, error = harness_error_or_records(lambda: resolve_impls([spec]))
    assert error is not None and error.startswith(impl_error(spec)), (spec, error)


def impl_error(spec: str) -> str:
    """How the one right message for an ``--impl`` that names nothing loadable begins (the registry's order:
    the ``torch@`` prefix, then ``MODULE:ATTR``, else an unknown name)."""
    from harness.impls.torch_patched import PREFIX

    if spec.startswith(PREFIX):
        path = spec[len(PREFIX):]
        return f"--impl {PREFIX!r}: give the folder" if not path else f"--impl {spec}: {path} holds neither"
    if ":" in spec:
        module, _, attr = spec.partition(":")
        if not attr:
            return f"plugin {spec!r} must be MODULE:ATTR"
        return f"plugin {spec!r}: importing module {module!r} failed: "
    return f"unknown impl {spec!r}: choose one of "
