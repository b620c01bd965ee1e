"""The sweeps' page: every upstream change undone and what caught it, the mutants and why each survivor lives.

:func:`markdown` renders ``docs/torch-fixes.md`` from the two results files
(:mod:`harness.undo.outcomes`), the changes (:mod:`harness.undo.fixes`) and the
survivors' explanations (``syncbn_mutants.toml``, :func:`survivors`), so the
page says nothing the files do not. :func:`problems` lists what the sweep
leaves unexplained: a fix or feature (:data:`MUST_CATCH`; a refactor, a
documentation or a performance change keeps behaviour by intent) undone and not
caught, or not undone, without a reason why it cannot be, a surviving mutant without an
entry, an entry for a mutant that is now killed or no longer exists.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Optional

from harness.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python < 3.11 only
    import tomli as tomllib

MUST_CATCH = ("fix", "feature")  # the kinds whose undoing changes what a case sees
COMMAND_FIXES = "syncbn-harness undo fixes --out docs/torch-fixes/fixes.json"
COMMAND_MUTANTS = "syncbn-harness undo mutants --out docs/torch-fixes/mutants.json"
COMMAND_PAGE = "syncbn-harness undo page"


def survivors(path: Optional[Path] = None) -> dict[str, str]:
    """``syncbn_mutants.toml``: mutant ID -> why it survives (equivalent to torch's code, or no case can tell)."""
    if path is None:
        from harness import cases

        path = Path(cases.__file__).parent / "syncbn_mutants.toml"
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{path}: {exc}") from None
    out = {}
    for i, entry in enumerate(data.get("survivor", []), 1):
        if not entry.get("id") or not entry.get("reason"):
            raise UsageError(f"{path}: [[survivor]] #{i} needs an id and a reason")
        out[entry["id"]] = entry["reason"]
    return out


def _short(link: str) -> str:
    parts = link.split("github.com/", 1)[-1].split("/")
    if "github.com/" in link and len(parts) >= 4 and parts[2] in ("issues", "pull"):
        return f"#{parts[3]}"
    return link


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def fix_verdict(fix, row: Optional[dict]) -> str:
    """One change's outcome in words: caught by a case, not caught (and why), or not undone (and why)."""
    if row is None:
        return "not run yet"
    if row.get("undo_error"):
        why = f"; {fix.uncatchable}" if fix.uncatchable else ""
        return f"not undone on {row['torch']}: {row['undo_error']}{why}"
    if row.get("reason"):
        return f"caught: the copy does not load ({row['reason'][:80]})"
    if row.get("case"):
        symptom = (row.get("symptoms") or [row["status"]])[0]
        return f"caught by `{row['case']}` ({row['control']} -> {row['status']}: {symptom[:90]})"
    if fix.uncatchable:
        return f"not caught ({row['ran']} cases): {fix.uncatchable}"
    if fix.kind not in MUST_CATCH:
        return f"not caught ({row['ran']} cases): a {fix.kind} change, same behaviour by intent"
    return f"**not caught** ({row['ran']} cases)"


def outcome_class(row: Optional[dict]) -> str:
    """``caught``, ``not caught``, ``not undone`` or ``not run``."""
    if row is None:
        return "not run"
    if row.get("undo_error"):
        return "not undone"
    return "caught" if row.get("case") or row.get("reason") else "not caught"


def problems(fixes: list, fix_rows: dict, mutant_rows: dict, explained: dict[str, str]) -> list[str]:
    """What the sweeps leave unexplained (see the module's note); empty when the page is a clean bill."""
    out = []
    for fix in fixes:
        row = fix_rows.get(fix.id)
        if row is None:
            out.append(f"{fix.id}: not run")
        elif fix.kind not in MUST_CATCH:
            continue  # a refactor, a documentation or performance change: nothing a case should see
        elif row.get("undo_error") and not fix.uncatchable:
            out.append(f"{fix.id}: not undone ({row['undo_error']}) and no reason why it cannot be")
        elif not row.get("undo_error") and not row.get("case") and not row.get("reason") and not fix.uncatchable:
            out.append(f"{fix.id}: undone and not caught, with no reason why no case can catch it")
    for ident, row in mutant_rows.items():
        caught = row.get("case") or row.get("reason")
        if not caught and ident not in explained:
            out.append(f"mutant {ident}: survives, not in syncbn_mutants.toml")
        if caught and ident in explained:
            out.append(f"mutant {ident}: killed by {row.get('case')}, but syncbn_mutants.toml says it survives")
    for ident in explained:
        if mutant_rows and ident not in mutant_rows:
            out.append(f"mutant {ident}: in syncbn_mutants.toml but no longer made from the installed files")
    return out


def markdown(fixes: list, fix_data: dict, mutant_data: dict, explained: dict[str, str], made: int = 0) -> str:
    """The page (see the module's note); ``made``: how many mutants the installed files give (the page says how
    many of them ran)."""
    fix_rows, mutant_rows = fix_data.get("rows", {}), mutant_data.get("rows", {})
    lines = ["# SyncBatchNorm's upstream changes, undone one at a time", "",
             "Each change to SyncBatchNorm's Python since torch 1.0 (`cases/syncbn_fixes.toml`) is undone on the",
             "installed build, alone, and the undone file runs as `--impl torch@DIR` until a case's record",
             "differs from the unchanged file's (`harness/undo/`). Then every small mutation of the same code",
             "runs the same way. This page is made from the results files beside it: `docs/torch-fixes/`.",
             "How it works: [undoing-fixes.md](undoing-fixes.md). Back to the [README](../README.md).", "",
             "Regenerate (over an hour on two cores over the whole default selection, most of it the variants",
             "that survive; `--case` narrows it, and each run below names the cases it used):", "", "```",
             COMMAND_FIXES, COMMAND_MUTANTS, COMMAND_PAGE, "```", ""]
    runs = Counter((r.get("torch"), r.get("date"), r.get("harness"), r.get("selection")) for r in fix_rows.values())
    runs.update((r.get("torch"), r.get("date"), r.get("harness"), r.get("selection")) for r in mutant_rows.values())
    for (torch, date, commit, selection), n in sorted(runs.items(), key=lambda kv: str(kv[0])):
        lines.append(f"- {n} rows checked on torch {torch}, {date}, harness {commit}, over {selection}")
    lines += ["", "## The changes", "",
              "| change | PR | release | kind | undone by | outcome |", "|---|---|---|---|---|---|"]
    kinds = Counter()
    for fix in fixes:
        row = fix_rows.get(fix.id)
        outcome = fix_verdict(fix, row)
        kinds[(fix.kind, outcome_class(row))] += 1
        how = "" if row is None or row.get("undo_error") else row.get("undone_by", "")
        link = f"[{_short(fix.link)}]({fix.link})" if fix.pr else "—"
        lines.append(f"| {_cell(fix.title)} | {link} | {fix.release} | {fix.kind} | {how} | {_cell(outcome)} |")
    classes = ("caught", "not caught", "not undone", "not run")
    lines += ["", "| kind | " + " | ".join(classes) + " |", "|---" * (len(classes) + 1) + "|"]
    for kind in sorted({k for k, _ in kinds}):
        lines.append(f"| {kind} | " + " | ".join(str(kinds[(kind, c)]) for c in classes) + " |")
    lines += ["", "## The mutants", ""]
    if not mutant_rows:
        lines.append("Not run yet.")
    else:
        by_op = Counter()
        for row in mutant_rows.values():
            by_op[(row["operator"], bool(row.get("case") or row.get("reason")))] += 1
        if made > len(mutant_rows):
            lines += [f"{len(mutant_rows)} of the {made} mutants of the installed files have run (a sample: "
                      f"`--sample`); the others have not, and nothing is claimed of them.", ""]
        lines += ["| operator | mutants | killed | survive |", "|---|---|---|---|"]
        for op in sorted({o for o, _ in by_op}):
            killed, alive = by_op[(op, True)], by_op[(op, False)]
            lines.append(f"| {op} | {killed + alive} | {killed} | {alive} |")
        alive = [i for i, r in mutant_rows.items() if not (r.get("case") or r.get("reason"))]
        if alive:
            lines += ["", f"{len(alive)} survive; each is explained in `cases/syncbn_mutants.toml`:", "",
                      "| mutant | why it survives |", "|---|---|"]
            for ident in alive:
                lines.append(f"| `{_cell(ident)}` | {_cell(explained.get(ident, '**unexplained**'))} |")
        else:
            lines += ["", "Every mutant that ran was killed."]
    left = problems(fixes, fix_rows, mutant_rows, explained)
    lines += ["", "## Left unexplained", ""] + ([f"- {p}" for p in left] if left else ["Nothing."])
    return "\n".join(lines) + "\n"
