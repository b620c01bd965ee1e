"""The sweeps' results as committed files: one JSON per sweep, with the build and date it ran on.

``fixes.json``: for each change of ``syncbn_fixes.toml``, how it was undone
(``markers``/``edits``) or why it could not be, and the :class:`Verdict` of the
undone file. ``mutants.json``: the verdict of every mutant run. Both carry the
torch build (version and git commit), the harness commit, the date and the
selection, so the page (:mod:`harness.undo.page`) says what was checked when.
A partial run (``--fix``, ``--sample``) merges into an existing file: rows it
ran replace theirs, the others stay with their own dates.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict
from pathlib import Path
from typing import Optional

from harness.errors import UsageError

SCHEMA = 1


def header(selection: str, patterns=(), exhaustive: bool = False) -> dict:
    """What every row of one run shares: the build, the harness commit, the date, the cases (in words, and the
    ``--case`` patterns and ``--exhaustive`` that chose them, so the run can be repeated)."""
    import torch

    from harness.gpu_suite.machine import provenance

    here = provenance()
    commit = (here.commit or "unknown")[:12] + ("" if here.clean in (True, None) else "+changes")
    return {"torch": torch.__version__, "torch_git": getattr(torch.version, "git_version", ""),
            "harness": commit, "date": dt.date.today().isoformat(), "selection": selection,
            "patterns": list(patterns), "exhaustive": exhaustive}


def row(verdict, **extra) -> dict:
    """A JSON row of a :class:`~harness.undo.sweep.Verdict` (``None``: not run) and ``extra`` fields."""
    out = dict(extra)
    if verdict is not None:
        out.update(asdict(verdict))
        out["symptoms"] = list(verdict.symptoms)
        out["seconds"] = round(verdict.seconds, 2)
    return out


def load(path: Path) -> dict:
    """A results file (``{"schema", "rows": {id: row}}``); an absent file is empty."""
    path = Path(path)
    if not path.exists():
        return {"schema": SCHEMA, "rows": {}}
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path}: not a sweep results file ({exc}); remove it or pass another --out") from None
    if data.get("schema") != SCHEMA or not isinstance(data.get("rows"), dict):
        raise UsageError(f"{path}: not a sweep results file of schema {SCHEMA}; remove it or pass another --out")
    return data


def merge(path: Path, rows: dict, run: dict, keep: Optional[set] = None) -> dict:
    """Write ``rows`` (id -> row, each stamped with ``run``) into ``path`` over what it holds; rows whose id is
    not in ``keep`` (when given: the ids that still exist) are dropped. Written whole, then renamed."""
    data = load(path)
    for ident, r in rows.items():
        data["rows"][ident] = {**r, **run}
    if keep is not None:
        data["rows"] = {k: v for k, v in data["rows"].items() if k in keep}
    data["rows"] = dict(sorted(data["rows"].items()))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    tmp.replace(path)
    return data
