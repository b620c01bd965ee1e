"""Known issues: a data file (``known_issues.toml`` beside the case catalog) of upstream defects.

Protocol: :func:`annotate` sets ``record.known_issue`` (a
:class:`~harness.results.records.KnownIssueMatch`) when an entry matches the
record's implementation, case ID (shell-style patterns), torch version (a
PEP 440 specifier) and, where the entry names them, device (a defect that shows
only on ``cuda``, say, because it needs a copy that only a move to the GPU makes)
and mode (the record's :class:`~harness.judge.mode.Mode`: apex's ``python-fallback`` and
not its ``optimized`` extension, say; a mode's notes never matter):
- the record has the entry's expected status and every one of its failures
  (:func:`harness.results.symptoms.failures`) is one the entry's ``symptoms``
  name: ``matched``; the failure is expected and does not fail
  ``run``/``check``/``gate``;
- the record has the expected status but also a failure the entry does not
  name: not matched, and ``unexpected`` lists those failures; a second defect
  landing on a case that already fails as known is a real failure, and its
  message starts with those failures, then the known issue's link;
- the record passes: ``now_passes``; reported so the entry can be retired;
- any other status: neither; a different failure is a real one.
"""

from __future__ import annotations

import fnmatch
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional, Sequence, Union

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from harness.errors import UsageError
from harness.judge.mode import Mode, parse as parse_mode
from harness.results import symptoms as symptoms_mod
from harness.judge.status import Status
from harness.results.records import KnownIssueMatch, Record

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python < 3.11 only
    import tomli as tomllib

REQUIRED = ("impl", "cases", "torch", "status", "link", "symptoms")


@dataclass(frozen=True)
class KnownIssue:
    """One entry of the known-issues file: which (impl, cases, torch versions) fail how, and where it is tracked."""

    impl: tuple[str, ...]  # shell-style patterns over implementation names ("*": every implementation)
    cases: tuple[str, ...]
    torch: SpecifierSet
    status: tuple[str, ...]
    link: str
    note: str = ""
    device: Optional[str] = None  # "cpu" or "cuda": the entry covers that device's records only; None: any
    mode: Optional[Mode] = None  # the records of this mode only; None: any
    symptoms: tuple[str, ...] = ()  # shell-style patterns over harness.results.symptoms.failures lines
    # The first and last torch release where the history (harness.history) shows the defect; None where the
    # history cannot show it, and then history_note says why (apex is not installed there, say).
    releases: Optional[tuple[str, str]] = None
    history_note: str = ""

    def covers(self, impl: str, case: str, version: Version, device: Optional[str] = None,
               mode: Union[Mode, str, None] = None) -> bool:
        """Whether this entry covers a record; ``torch@PATH`` (a patched copy of torch's SyncBatchNorm) is
        covered as ``torch`` is, so that only what the patch changes shows. ``mode``: a record's mode, or the
        one-string form of rows written before modes had notes apart (:func:`harness.judge.mode.parse`)."""
        names = (impl, impl.split("@", 1)[0]) if impl.startswith("torch@") else (impl,)
        return (any(fnmatch.fnmatchcase(n, p) for n in names for p in self.impl) and any(fnmatch.fnmatchcase(case, p)
                                                                            for p in self.cases)
                and self.torch.contains(version, prereleases=True)
                and (self.device is None or device == self.device)
                and (self.mode is None or parse_mode(mode)[0] is self.mode))


def default_path() -> Path:
    from harness import cases

    return Path(cases.__file__).with_name("known_issues.toml")


@lru_cache(maxsize=8)
def load(path: Optional[str] = None) -> tuple[KnownIssue, ...]:
    """The entries of a known-issues file, validated (a bad entry is a usage error naming it)."""
    p = Path(path) if path else default_path()
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"known-issues file {p} cannot be read: {exc}") from None
    entries = []
    issues = data.get("issue", [])
    if not isinstance(issues, list) or not all(isinstance(e, dict) for e in issues):
        raise UsageError(f"{p}: `issue` must be an array of tables, each entry starting with a line [[issue]]")
    for i, e in enumerate(issues):
        missing = [k for k in REQUIRED if k not in e]
        if missing:
            raise UsageError(f"{p}: issue #{i + 1} lacks {', '.join(missing)} (needs {', '.join(REQUIRED)})")
        for key in ("impl", "cases", "status", "symptoms"):
            values = e[key] if isinstance(e[key], list) else [e[key]]
            if not values or not all(isinstance(v, str) and v for v in values):
                raise UsageError(f"{p}: issue #{i + 1} {key} = {e[key]!r}: give a non-empty string or a list of them")
        for key in ("torch", "link"):
            if not isinstance(e[key], str):
                raise UsageError(f"{p}: issue #{i + 1} {key} = {e[key]!r}: give a string "
                                 + ("(a version specifier, e.g. '>=1.12,<2.15')" if key == "torch" else "(a URL)"))
        try:
            spec = SpecifierSet(e["torch"])
        except InvalidSpecifier:
            raise UsageError(f"{p}: issue #{i + 1} torch = {e['torch']!r} is not a version specifier "
                             "(e.g. '>=1.12,<2.15')") from None
        statuses = e["status"] if isinstance(e["status"], list) else [e["status"]]
        for s in statuses:
            try:
                Status(s)
            except ValueError:
                raise UsageError(f"{p}: issue #{i + 1} status {s!r} is not one of "
                                 f"{', '.join(x.value for x in Status)}") from None
        device = e.get("device")
        if device not in (None, "cpu", "cuda"):
            raise UsageError(f"{p}: issue #{i + 1} device = {device!r}: give \"cpu\" or \"cuda\", or leave it "
                             "out for a defect seen on both")
        mode = e.get("mode")
        if mode is not None and mode not in Mode._value2member_map_:
            raise UsageError(f"{p}: issue #{i + 1} mode = {mode!r}: give one of "
                             f"{', '.join(repr(m.value) for m in Mode)}, or leave it out for every mode")
        named = e["symptoms"] if isinstance(e["symptoms"], list) else [e["symptoms"]]
        for pattern in named:
            why = symptoms_mod.check_pattern(pattern)
            if why:
                raise UsageError(f"{p}: issue #{i + 1} symptoms: {why}")
        releases, history_note = _releases(p, i, e.get("releases"))
        patterns = e["cases"] if isinstance(e["cases"], list) else [e["cases"]]
        impls = e["impl"] if isinstance(e["impl"], list) else [e["impl"]]
        entries.append(KnownIssue(impl=tuple(impls), cases=tuple(patterns), torch=spec, status=tuple(statuses),
                                  link=e["link"], note=" ".join(str(e.get("note", "")).split()), device=device,
                                  mode=Mode(mode) if mode else None, symptoms=tuple(named), releases=releases,
                                  history_note=history_note))
    return tuple(entries)


def _releases(p: Path, i: int, value) -> tuple[Optional[tuple[str, str]], str]:
    """An entry's optional ``releases``: [first, last] (torch versions), or a sentence saying why the history
    cannot show the defect."""
    if value is None:
        return None, ""
    if isinstance(value, str) and value.strip():
        return None, value.strip()
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
        try:
            first, last = Version(value[0]), Version(value[1])
        except InvalidVersion:
            first = last = None
        if first is not None and first <= last:
            return (value[0], value[1]), ""
    raise UsageError(f"{p}: issue #{i + 1} releases = {value!r}: give [\"FIRST\", \"LAST\"] (the torch releases "
                     "where the history shows it, oldest first, e.g. [\"2.1.2\", \"2.14.1\"]), or a sentence "
                     "saying why the history cannot show it")


def covering(impl: str, case: str, torch_version: str, path: Optional[str] = None, device: Optional[str] = None,
             mode: Optional[str] = None) -> list[KnownIssue]:
    """Every entry for (impl, case, torch version, device, mode), in the file's order."""
    try:
        version = Version(torch_version)
    except InvalidVersion:
        return []
    return [e for e in load(path) if e.covers(impl, case, version, device, mode)]


def match(impl: str, case: str, torch_version: str, path: Optional[str] = None,
          device: Optional[str] = None, mode: Optional[str] = None) -> Optional[KnownIssue]:
    """The first entry for (impl, case, torch version, device, mode), or None."""
    found = covering(impl, case, torch_version, path, device, mode)
    return found[0] if found else None


def explain(found: Sequence[KnownIssue], status: str, failures: Sequence[str]
            ) -> tuple[list[KnownIssue], tuple[str, ...]]:
    """Of the entries ``found`` covering a record: those expecting its ``status``, and the ``failures`` none of
    their symptoms name (none when no entry expects the status: nothing was explained). The record is known
    when some entry expects it and nothing is left unexplained."""
    expecting = [e for e in found if status in e.status]
    unexplained = symptoms_mod.unexplained(failures, [p for e in expecting for p in e.symptoms]) if expecting else ()
    return expecting, unexplained


def annotate(record: Record, path: Optional[str] = None) -> Record:
    """Set ``record.known_issue`` from the known-issues file (see the module docstring).

    Where several entries cover the record (two known defects on one case: a crash and a one-value
    acceptance, say), those that expect its status explain it together: each of its failures must be a
    symptom one of them names. The first of them gives the link.
    """
    found = covering(record.impl, record.case, record.torch_version, path, record.device, record.mode)
    if not found:
        return record
    expecting, unexpected = explain(found, record.status.value, symptoms_mod.failures(record))
    e = expecting[0] if expecting else found[0]
    record.known_issue = KnownIssueMatch(link=e.link, expected=e.status, note=e.note,
                                         matched=bool(expecting) and not unexpected,
                                         now_passes=record.status == Status.PASS, unexpected=unexpected)
    if unexpected:
        # What no entry explains comes first: consoles cut a message at their width.
        record.message = ("unexpected beside a known issue: " + "; ".join(unexpected[:3])
                          + (f" (and {len(unexpected) - 3} more)" if len(unexpected) > 3 else "")
                          + f" [known: {e.link}]" + (f" | {record.message}" if record.message else ""))
    return record
