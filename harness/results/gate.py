"""The CI gate: the current build's records against a baseline, exit 1 on any regression or missing result.

The baseline is a file of records: the JSON array printed by ``run --format
json``, or a store ``.jsonl`` file. The current records come from the store
(this build's file) or from a fresh run of the selection. Both are compared
by (impl, case) with :mod:`harness.results.diff`. The gate fails on:

- a regression: a baseline pass that is anything else now, or error growth;
- a missing result: a (case, impl) the baseline ran (not skipped or
  unsupported) that the current records lack. A run that crashed halfway, or
  selected fewer cases by mistake, must not pass; ``allow_missing`` accepts a
  deliberate subset.

A change of the collectives the ranks issued (same status, another pattern
of collectives: count, op, dtype, size) is listed; it fails the gate only with
``fail_on_collectives`` (a CI that pins the communication pattern). A change
of what torch.compile did (a new graph break, another graph count) is listed
the same way and fails only with ``fail_on_compilation``.

A failure that was already failing in the baseline is not a regression. A
gate that compares nothing at all is refused: it would pass vacuously.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Optional, Sequence

from harness.errors import UsageError
from harness.results.diff import DEFAULT_RULE, MISSING_ON_A_SIDE, Change, ChangeKind, GrowthRule, changes
from harness.results.junit import detail
from harness.judge.status import NOT_RUN, Status
from harness.results.records import Record
from harness.results.store import Store, Where, read_file, record_key

MISSING = "MISSING"


class GateError(UsageError):
    """The gate has nothing to compare, or no current records (exit 2)."""


@dataclass
class GateResult:
    """Every (impl, case) change between the baseline and now, and the verdict."""

    changes: list[Change]
    baseline_builds: list[str]
    current_builds: list[str]
    allow_missing: bool = False
    fail_on_collectives: bool = False
    fail_on_compilation: bool = False

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.regression]

    @property
    def missing(self) -> list[Change]:
        """Pairs the baseline ran that the current records lack."""
        return [c for c in self.changes if c.kind is ChangeKind.ONLY_BEFORE and c.before.status not in NOT_RUN]

    @property
    def collectives_changed(self) -> list[Change]:
        """Pairs whose ranks issued another pattern of collectives, with the same status."""
        return [c for c in self.changes if c.kind is ChangeKind.COLLECTIVES]

    @property
    def compilation_changed(self) -> list[Change]:
        """Compiled pairs whose graphs, graph breaks or eager frames changed, with the same status."""
        return [c for c in self.changes if c.kind is ChangeKind.COMPILATION]

    @property
    def compared(self) -> list[Change]:
        return [c for c in self.changes if c.kind not in MISSING_ON_A_SIDE]

    @property
    def exit_code(self) -> int:
        """1 on any regression (or missing result unless allowed, or collectives change if asked), 0 otherwise."""
        return 1 if (self.regressions or (self.missing and not self.allow_missing)
                     or (self.fail_on_collectives and self.collectives_changed)
                     or (self.fail_on_compilation and self.compilation_changed)) else 0


def load_baseline(path) -> list[Record]:
    """Records of a baseline file (``run --format json`` output or a store .jsonl file)."""
    records = read_file(path)
    if not records:
        raise GateError(f"baseline {path} holds no records: write one with `syncbn-harness run --format json "
                        f"> {path}` on the build you trust")
    return records


def stored_current(store_dir, key: str, impls: Sequence[str] = (), case_patterns: Sequence[str] = ()) -> list[Record]:
    """This build's latest records from the store, optionally only some impls and case patterns."""
    with Store(store_dir) as store:
        if key not in store.builds():
            present = ", ".join(store.builds()) or "none"
            raise GateError(f"the store {store_dir} holds no records of this build ({key}); builds present: "
                            f"{present}. Run `syncbn-harness run --store {store_dir}` first, or gate a fresh run by "
                            "leaving out --store")
        records = list(store.latest(Where(build=key)))
    if impls:
        records = [r for r in records if r.impl in impls]
    if case_patterns:
        records = [r for r in records if any(fnmatch.fnmatchcase(r.case, p) for p in case_patterns)]
    return records


def evaluate(baseline: Sequence[Record], current: Sequence[Record], rule: GrowthRule = DEFAULT_RULE, *,
             allow_missing: bool = False, fail_on_collectives: bool = False,
             fail_on_compilation: bool = False) -> GateResult:
    """Compare ``current`` with ``baseline``; refuse a comparison with no (impl, case) in common."""
    if not current:
        raise GateError("no current records to gate (the selection or the store filters left none)")
    result = GateResult(changes(baseline, current, rule), sorted({record_key(r) for r in baseline}),
                        sorted({record_key(r) for r in current}), allow_missing, fail_on_collectives,
                        fail_on_compilation)
    if not result.compared:
        base_impls = sorted({r.impl for r in baseline})
        cur_impls = sorted({r.impl for r in current})
        raise GateError(f"the baseline and the current records share no (case, impl): baseline impls "
                        f"{base_impls} over {len(baseline)} records, current {cur_impls} over {len(current)}; "
                        "select the same cases and implementations as the baseline (--impl, --case)")
    return result


def format_result(result: GateResult, baseline_name: str) -> str:
    """What ``gate`` prints: the regressions, the missing results, the other changes, the verdict."""
    lines = [f"gate: baseline {baseline_name} ({', '.join(result.baseline_builds)}) against "
             f"{', '.join(result.current_builds)}: {len(result.compared)} (case, impl) compared"]
    for c in result.regressions:
        lines.append(f"REGRESSION  {c.case}  [{c.impl}]  {c.describe()}")
    missing = result.missing
    label = "missing" if result.allow_missing else MISSING
    for c in missing:
        lines.append(f"{label:<11} {c.case}  [{c.impl}]  {c.before.status.value} in the baseline, not in the current "
                     "records")
    others = [c for c in result.changes if not c.regression and c.kind not in (ChangeKind.SAME, ChangeKind.ONLY_BEFORE)]
    for c in others:
        failing = (c.kind is ChangeKind.COLLECTIVES and result.fail_on_collectives) or (
            c.kind is ChangeKind.COMPILATION and result.fail_on_compilation)
        kind = c.kind.value.upper() if failing else c.kind.value
        lines.append(f"{kind:<11} {c.case}  [{c.impl}]  {c.describe()}")
    n, m = len(result.regressions), len(missing)
    verdict = f"gate: {n} regression{'s' if n != 1 else ''}"
    k = len(result.collectives_changed)
    if k:
        verdict += f", {k} with other collectives" + (" (failing: --fail-on-collectives-change)"
                                                      if result.fail_on_collectives else " (reported, not failing)")
    k = len(result.compilation_changed)
    if k:
        verdict += f", {k} compiled differently" + (" (failing: --fail-on-graph-break-change)"
                                                    if result.fail_on_compilation else " (reported, not failing)")
    if m:
        verdict += f", {m} missing" + (" (allowed by --allow-missing)" if result.allow_missing else
                                       " (a run that stopped early, or a smaller selection: --allow-missing "
                                       "accepts a deliberate subset)")
    lines.append(verdict + (" (exit 1)" if result.exit_code else ", pass (exit 0)"))
    return "\n".join(lines)


def junit_rows(result: GateResult) -> list[dict]:
    """One JUnit testcase per (case, impl) of either side; regressions and missing results fail."""
    rows = []
    for c in result.changes:
        rec = c.after or c.before
        row = {"classname": c.impl, "name": c.case, "time": rec.duration_s if c.after else 0.0}
        if c.regression:
            kind = "regression" if c.kind is ChangeKind.STATUS_CHANGE else c.kind.value
            row.update(outcome="failure", type=kind,
                       message=f"regression against the baseline: {c.describe()}", detail=_detail(c.after))
        elif c.kind is ChangeKind.COLLECTIVES and result.fail_on_collectives:
            row.update(outcome="failure", type="collectives", message=f"collectives changed: {c.describe()}",
                       detail=_detail(c.after))
        elif c.kind is ChangeKind.COMPILATION and result.fail_on_compilation:
            row.update(outcome="failure", type="compilation", message=f"compilation changed: {c.describe()}",
                       detail=_detail(c.after))
        elif c.kind is ChangeKind.ONLY_BEFORE:
            missing = c.before.status not in NOT_RUN and not result.allow_missing
            row.update(outcome="failure" if missing else "skipped", type="missing",
                       message=f"{c.before.status.value} in the baseline, missing from the current records")
        elif c.after.status != Status.PASS:
            why = "new case" if c.before is None else f"{c.before.status.value} in the baseline too"
            known = f" (known issue {c.after.known_issue.link})" if c.after.known else ""
            row.update(outcome="skipped", message=f"{c.after.status.value}{known}, not a regression ({why}): "
                                                  f"{c.after.message[:300]}")
        else:
            row.update(outcome="pass")
        rows.append(row)
    return rows


def _detail(record: Optional[Record]) -> str:
    if record is None:
        return ""
    bad = [f"{name}: err {m.max_abs_err:.3g} tol {m.tol:.3g} ratio {m.ratio:.3g} {m.problem or ''}".rstrip()
           for name, m in record.metrics.items() if not m.ok]
    return "\n".join([detail(record)] + bad[:20])
