"""The promoted search cases: the reading side of the file ``search --save`` and ``promote`` write.

The file (``search_found.json`` beside the case catalog, or
``$SYNCBN_HARNESS_FOUND``) is a JSON list of ``{"case": <Case.to_dict()>,
"finding": {...}}`` entries; :mod:`harness.search.promote` writes it, the
``search`` family of :mod:`harness.cases.search_found` reads it through
:func:`promoted_cases`. Every promoted case is in the default selection.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from harness.catalog.case import Case
from harness.errors import UsageError
from harness.paths import found_cases_file

FILENAME = "search_found.json"


def default_path() -> Path:
    """``$SYNCBN_HARNESS_FOUND``, or ``search_found.json`` beside the case catalog."""
    from harness import cases

    return found_cases_file(Path(cases.__file__).parent)


def load(path: Optional[Path] = None) -> list[dict]:
    """The promoted entries (an absent file: none); a file that is not such a list is a usage error naming it."""
    p = Path(path) if path else default_path()
    if not p.exists():
        return []
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
        if not isinstance(data, list):
            raise ValueError("not a JSON list")
        for n, entry in enumerate(data, 1):
            try:
                Case.from_dict(entry["case"])
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"entry {n}: {exc}") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"promoted-cases file {p} cannot be read ({exc}): fix or remove the entry, or restore the "
                         "file from version control") from None
    return data


def promoted_cases(path: Optional[Path] = None) -> list[Case]:
    """The promoted cases, in the default selection."""
    out = []
    for entry in load(path):
        d = dict(entry["case"])
        d["default"] = True
        out.append(Case.from_dict(d))
    return out
