"""Results as data: a record of one (case, implementation), its known-issue match and overlay identity.

A :class:`Record` is the result of one (case, implementation) on one build. It
round-trips through ``to_dict``/``from_dict`` (JSON-safe) and carries
``schema_version`` so stores can refuse newer formats and migrate older ones.
Every field that has a closed set of values is typed: :class:`Status` for a
record and :class:`RankStatus` for one rank (the judge's words,
:mod:`harness.judge.status`), :class:`~harness.judge.mode.Mode` for how the
implementation ran (its notes kept apart, in ``mode_notes``),
:class:`~harness.judge.metric.Metric` per compared tensor, :class:`KnownIssueMatch` for the known-issues file's say,
:class:`Overlay` for a Python overlay build's identity (what the store key of
such a build is made of; ``torch_git_version`` keeps its prose for people).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Optional

from harness import SCHEMA_VERSION
from harness.judge.call import Call, read_calls
from harness.judge.metric import Metric, worst_ratio
from harness.judge.metric_key import MetricKey
from harness.judge import mode as mode_words
from harness.judge.mode import Mode
from harness.judge.status import FAILURES, NOT_RUN, WORST_FIRST, RankOutcome, RankStatus, Status
from harness.results import evidence

__all__ = ["FAILURES", "NOT_RUN", "WORST_FIRST", "KnownIssueMatch", "Mode", "Overlay", "RankOutcome", "RankStatus",
           "Record", "Status", "check_fields"]


@dataclass(frozen=True)
class KnownIssueMatch:
    """What the known-issues file says of a record.

    ``matched``: the record has the entry's expected failure status and every
    one of its failures is a symptom the entry names (expected; it fails
    nothing). ``now_passes``: the record passes although the entry expects a
    failure (the entry may be retired). Otherwise the record fails in another
    way than the entry expects, which is a real failure; ``unexpected`` lists
    its failures the entry does not name (a second defect beside the known one).
    """

    link: str
    expected: tuple[str, ...]
    note: str = ""
    matched: bool = False
    now_passes: bool = False
    unexpected: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"link": self.link, "expected": list(self.expected), "note": self.note, "matched": self.matched,
                "now_passes": self.now_passes, "unexpected": list(self.unexpected)}

    @classmethod
    def from_dict(cls, d: dict) -> "KnownIssueMatch":
        return cls(link=d.get("link", ""), expected=tuple(d.get("expected", ())), note=d.get("note", ""),
                   matched=bool(d.get("matched")), now_passes=bool(d.get("now_passes")),
                   unexpected=tuple(d.get("unexpected") or ()))


@dataclass(frozen=True)
class Overlay:
    """A Python overlay build: ``commit``'s Python files laid over a binary whose git version is ``base``;
    ``left_out``: how many compiled files of the commit differ from the binary's and were left out (0: exact)."""

    commit: str
    base: str
    left_out: int = 0

    def __post_init__(self) -> None:
        for name in ("commit", "base"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value or any(c.isspace() for c in value):
                raise ValueError(f"overlay {name} {str(value)[:40]!r}: expected a git version, one word")
        if not isinstance(self.left_out, int) or isinstance(self.left_out, bool) or self.left_out < 0:
            raise ValueError(f"overlay left_out {str(self.left_out)[:40]!r}: expected a count of files (0 or more)")

    @property
    def approximate(self) -> bool:
        """Whether compiled files of the commit were left out (the build is not exactly the commit)."""
        return self.left_out > 0

    def key(self) -> str:
        """The commit part of its store key: ``<commit>-on-<base>``, 12 digits each."""
        return f"{self.commit[:12]}-on-{self.base[:12]}"

    def describe(self) -> str:
        """``overlay of <commit> on <base>``, then ``(approximate: N compiled files left out)`` when it is: the
        text its records' ``torch_git_version`` shows people."""
        text = f"overlay of {self.commit} on {self.base}"
        return text + (f" (approximate: {self.left_out} compiled files left out)" if self.left_out else "")

    def to_dict(self) -> dict:
        return {"commit": self.commit, "base": self.base, "left_out": self.left_out}

    @classmethod
    def from_dict(cls, d: dict) -> "Overlay":
        if not isinstance(d, dict) or "commit" not in d or "base" not in d:
            raise ValueError(f"overlay {str(d)[:60]!r}: expected its commit, base and left_out")
        return cls(commit=d["commit"], base=d["base"], left_out=d.get("left_out", 0))


@dataclass
class Record:
    """One (case, impl) result on one build."""

    case: str
    family: str
    params: dict
    impl: str
    status: Status
    message: str = ""
    impl_version: Optional[str] = None
    mode: Optional[Mode] = None
    mode_notes: tuple[str, ...] = ()  # what else the run says of its mode ("nvtx no-op", "DDP's CPU ... skipped")
    ranks: list[RankOutcome] = field(default_factory=list)
    metrics: dict[str, Metric] = field(default_factory=dict)
    torch_version: str = ""
    torch_git_version: str = ""
    overlay: Optional[Overlay] = None  # a Python overlay build's identity (its store key is made of it)
    cuda_version: Optional[str] = None
    device: str = "cpu"
    backend: str = "gloo"
    world_size: int = 0
    duration_s: float = 0.0
    started_at: str = ""
    host: str = ""
    known_issue: Optional[KnownIssueMatch] = None
    # The evidence beyond the status; shapes in harness.results.evidence, checked when a record is read.
    compare: Optional[evidence.Compare] = None  # differences with another implementation on the same inputs
    desync: Optional[evidence.Desync] = None  # the first collective the ranks of a group disagreed on
    diagnosis: Optional[evidence.Diagnosis] = None  # what a second, debug-enabled run of a crash or hang said
    compile: Optional[evidence.Compile] = None  # torch.compile metrics per rank (graphs, breaks, recompiles)
    logs: Optional[str] = None  # a failing case's rank logs, kept in the harness cache (bounded)
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        # A mode given by its value ("native") is the enum's member; a composite string is refused here.
        self.mode = Mode(self.mode) if self.mode is not None else None
        self.mode_notes = tuple(self.mode_notes)

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["status"] = self.status.value
        d["mode"] = self.mode.value if self.mode else None
        d["mode_notes"] = list(self.mode_notes)
        d["ranks"] = [r.to_dict() for r in self.ranks]
        d["metrics"] = {name: m.to_dict() for name, m in self.metrics.items()}
        d["known_issue"] = self.known_issue.to_dict() if self.known_issue else None
        d["overlay"] = self.overlay.to_dict() if self.overlay else None
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Record":
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        check_fields(kw)
        kw["status"] = Status(kw["status"])
        kw["mode"] = Mode(kw["mode"]) if kw.get("mode") else None
        kw["mode_notes"] = tuple(kw.get("mode_notes") or ())
        kw["ranks"] = [RankOutcome.from_dict(r) for r in kw.get("ranks") or []]
        kw["metrics"] = {name: Metric.from_dict(m) for name, m in (kw.get("metrics") or {}).items()}
        if kw.get("known_issue"):
            kw["known_issue"] = KnownIssueMatch.from_dict(kw["known_issue"])
        if kw.get("overlay") is not None:
            kw["overlay"] = Overlay.from_dict(kw["overlay"])
        for name in evidence.REQUIRED:
            evidence.check(name, kw.get(name))
        return cls(**kw)

    @property
    def known(self) -> bool:
        """A failure the known-issues file expects."""
        return bool(self.known_issue and self.known_issue.matched)

    @property
    def failed(self) -> bool:
        """A failure that is not an expected known issue."""
        return self.status in FAILURES and not self.known

    @property
    def emulated(self) -> bool:
        """Whether the verdict was reached over CPU stand-ins for CUDA's kernels (not yet confirmed on CUDA)."""
        return bool(self.mode and self.mode.emulated)

    @property
    def mode_text(self) -> str:
        """The mode and its notes as people read them: ``python-fallback (nvtx no-op)``; '' for none."""
        return mode_words.text(self.mode, self.mode_notes)

    @property
    def ran(self) -> bool:
        """Whether the case ran at all (not skipped or unsupported)."""
        return self.status not in NOT_RUN

    @property
    def worst_ratio(self) -> Optional[float]:
        """The largest error/tolerance ratio among the compared tensors (None if none was compared)."""
        return worst_ratio(self.metrics.values())

    @property
    def label(self) -> str:
        """The status as shown to people: ``crash (known)`` for an expected upstream defect."""
        if self.known:
            return f"{self.status.value} (known)"
        if self.known_issue and self.known_issue.now_passes:
            return "pass (known issue fixed?)"
        if self.known_issue and self.known_issue.unexpected:
            return f"{self.status.value} (beside a known issue)"
        return self.status.value

    def failing_metrics(self) -> list[str]:
        """The names of the failing metrics, earliest first: by step, then as the scenario listed them
        (a rank's own tensors before the checks across ranks)."""
        names = [name for name, m in self.metrics.items() if not m.ok]
        return sorted(names, key=lambda n: (MetricKey.parse(n).order, names.index(n)))

    def first_failure(self) -> Optional[str]:
        """The name of the earliest failing metric (:meth:`failing_metrics`), None when none fails."""
        return next(iter(self.failing_metrics()), None)

    def first_rank(self, status: RankStatus) -> Optional[RankOutcome]:
        """The lowest rank that ended with ``status`` (the first to raise, to crash), None when none did."""
        return next((r for r in self.ranks if r.status == status), None)

    @property
    def desync_message(self) -> str:
        """What the first collective the ranks disagreed on was ('' when they agreed or were not compared)."""
        return self.desync["message"] if self.desync else ""

    def desync_calls(self) -> list[Call]:
        """The calls the ranks issued at the first collective they disagreed on, in rank order; a rank that
        issued none there is left out (empty when they agreed)."""
        stored = (self.desync or {}).get("calls") or {}
        return read_calls(c for c in stored.values() if c)

    @property
    def diagnosis_summary(self) -> str:
        """The debug-enabled rerun's summary of a crash or hang ('' without one)."""
        return (self.diagnosis or {}).get("summary") or ""

    def compile_ranks(self) -> dict[str, dict]:
        """``torch.compile``'s metrics per rank (rank as a string -> its graphs, breaks, ...); empty when not
        compiled."""
        return (self.compile or {}).get("ranks") or {}


_OPT = type(None)
# What a stored record's fields must be (status is checked by its enum, the evidence by its shapes).
_FIELD_TYPES = {"case": str, "family": str, "params": dict, "impl": str, "message": str, "impl_version": (str, _OPT),
                "mode": (str, _OPT), "mode_notes": list, "ranks": list, "metrics": dict, "torch_version": str,
                "torch_git_version": str, "overlay": (dict, _OPT), "cuda_version": (str, _OPT), "device": str,
                "backend": str, "world_size": int, "duration_s": (int, float), "started_at": str, "host": str,
                "known_issue": (dict, _OPT), "compare": (dict, _OPT), "desync": (dict, _OPT),
                "diagnosis": (dict, _OPT), "compile": (dict, _OPT), "logs": (str, _OPT), "schema_version": int}


def check_fields(d: dict) -> None:
    """Raise TypeError naming the first field of a stored record dict whose type is wrong, ValueError for an
    unknown status (what :meth:`Record.from_dict` checks first; the store's index checks the same)."""
    for k, v in d.items():
        want = _FIELD_TYPES.get(k)
        if want is not None and not isinstance(v, want):
            names_of = " or ".join("null" if t is _OPT else t.__name__ for t in
                                   (want if isinstance(want, tuple) else (want,)))
            raise TypeError(f"field {k!r} is {type(v).__name__} {str(v)[:40]!r}, expected {names_of}")
    if d.get("mode") is not None and d["mode"] not in Mode._value2member_map_:
        raise ValueError(f"mode {str(d['mode'])[:40]!r} is not one of {', '.join(m.value for m in Mode)}")
    if "status" in d and not (isinstance(d["status"], str) and d["status"] in Status._value2member_map_):
        raise ValueError(f"status {str(d['status'])[:40]!r} is not one of {', '.join(s.value for s in Status)}")
