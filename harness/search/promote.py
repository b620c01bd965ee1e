"""Promotion: a finding's minimal case becomes a catalog case that ``run``, ``gate`` and ``check`` select.

The catalog file is ``search_found.json`` beside the case catalog, or the
file ``$SYNCBN_HARNESS_FOUND`` names (:mod:`harness.catalog.found` reads it
for the ``search`` family of :mod:`harness.cases.search_found`): a JSON list
of ``{"case": <Case.to_dict()>, "finding": {signature, impl, torch_version,
torch_git_version, promoted_at, message}}``, one entry per case ID, in the
order they were promoted. Promoted cases are in the default selection. The
file is rewritten whole under a lock (written beside it, then renamed), so a
reader never sees half a file and two searches saving at once lose nothing.
"""

from __future__ import annotations

import datetime
import json
import os
import tempfile
from pathlib import Path
from typing import Iterable, Optional

from harness.errors import UsageError
from harness.catalog.found import FILENAME, default_path, load, promoted_cases  # noqa: F401 - reading side
from harness.search.rules import Finding


def from_summary(summary: Path, numbers: Iterable[int] = ()) -> list[Finding]:
    """The new findings of a ``findings.json`` (``numbers``: only these, counted from 1 as the summary lists
    them), as :func:`promote` takes them; a bad file or number is a usage error naming it."""
    try:
        data = json.loads(Path(summary).read_text(encoding="utf-8"))
        listed = data["findings"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{summary} is not a search summary (findings.json): {exc}") from None
    wanted = list(numbers) or [n for n, f in enumerate(listed, 1) if not f.get("known")]
    out = []
    for n in wanted:
        if not 1 <= n <= len(listed):
            raise UsageError(f"--finding {n}: {summary} lists findings 1 to {len(listed)}")
        f = listed[n - 1]
        if "minimal" not in f:
            raise UsageError(f"finding {n} of {summary} has no case data (written by an older search): run the "
                             "search again")
        try:
            out.append(Finding.from_dict(f))
        except (KeyError, ValueError, TypeError) as exc:
            raise UsageError(f"finding {n} of {summary} is not a search finding: {exc!r}") from None
    return out


def promote(findings: Iterable, *, build, path: Optional[Path] = None) -> tuple[Path, list[str]]:
    """Add each finding's minimal case (new ones only) to the catalog file; returns it and the IDs added."""
    from filelock import FileLock

    p = Path(path) if path else default_path()
    added: list[str] = []
    with FileLock(str(p) + ".lock", timeout=60):
        entries = load(p)
        have = {e["case"]["id"] for e in entries}
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        for f in findings:
            if f.minimal.id in have:
                continue
            entries.append({"case": {**f.minimal.to_dict(), "default": True},
                            "finding": {"signature": f.signature, "impl": f.impl,
                                        "torch_version": build.torch_version,
                                        "torch_git_version": build.torch_git_version, "promoted_at": now,
                                        "message": (f.record.message or "")[:500]}})
            have.add(f.minimal.id)
            added.append(f.minimal.id)
        fd, tmp = tempfile.mkstemp(prefix=".search_found-", suffix=".json", dir=p.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(entries, fh, indent=1)
                fh.write("\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, p)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return p, added
