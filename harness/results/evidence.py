"""The shapes of what a record carries beyond its status: ``compare``, ``desync``, ``diagnosis``, ``compile``.

Each is plain JSON data in the store (a record is one JSON line), declared
here as a ``TypedDict`` so that every producer and reader names the same
keys, and checked when a record is read (:func:`check`): a stored record
whose evidence lacks a required key is refused with the field and the key,
instead of failing later inside a report.

Producers: ``compare`` by :func:`harness.engine.assemble.merge_compare`
(``run --compare A,B``), ``desync`` by :mod:`harness.judge.desync`,
``diagnosis`` by :mod:`harness.engine.diagnosis`, ``compile`` by
:mod:`harness.engine.compiled` (merged over ranks by the assembler).
"""

from __future__ import annotations

from typing import Any, Optional, TypedDict


class Compare(TypedDict):
    """How implementation A differed from B on the same inputs: the largest difference per tensor and step."""

    with_: str  # stored under the key "with"
    max_abs_diff: dict[str, float]  # "step<s>.<kind>.<tensor>" -> max |A - B| over ranks
    error: Optional[str]  # B could not run the case (unsupported: ...)


class Desync(TypedDict):
    """The first collective on which the ranks of a group disagreed."""

    group: list[int]
    index: int
    message: str
    calls: dict[str, Any]  # rank -> that rank's call at ``index`` (None: it made none)


class DiagnosisRank(TypedDict):
    rank: int
    status: str
    message: str
    evidence: list[str]


class Diagnosis(TypedDict):
    """What a second run of a crash or hang said with collective debugging on (the status is the first run's)."""

    env: dict[str, str]
    status: Optional[str]
    message: str
    ranks: list[DiagnosisRank]
    summary: Optional[str]


class Compile(TypedDict, total=False):
    """torch.compile's options once, then per rank: graphs, ops, graph breaks, eager frames, recompiles."""

    backend: str
    fullgraph: bool
    dynamic: Optional[bool]
    ranks: dict[str, dict[str, Any]]


# field -> the keys it must have (Compare's ``with_`` is the JSON key ``with``)
REQUIRED = {
    "compare": ("with", "max_abs_diff", "error"),
    "desync": ("group", "index", "message", "calls"),
    "diagnosis": ("env", "status", "message", "ranks", "summary"),
    "compile": ("ranks",),
}


def check(field: str, value: Any) -> None:
    """Raise ValueError naming ``field`` and the missing key when ``value`` is not that field's shape."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise ValueError(f"record field {field!r} is {type(value).__name__}, not an object")
    missing = [k for k in REQUIRED[field] if k not in value]
    if missing:
        raise ValueError(f"record field {field!r} lacks {', '.join(missing)}")
