"""The CI gate: the current build's records against a baseline, exit 1 on any regression.

The baseline is a file of records: the JSON array printed by ``run --format
json``, or a store ``.jsonl`` file. The current records come from the store
(this build's file, read) or from a fresh run of the selection. Both are
compared by (impl, case) with :mod:`harness.builddiff`; a regression is a
baseline pass that is anything else now, or error growth beyond the rule.
A failure that was already failing in the baseline is not a regression, and
neither is a case that only one side has (it is listed, and a gate that
compares nothing at all is refused, since it would pass vacuously).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Optional, Sequence

from harness.builddiff import DEFAULT_RULE, ONLY_AFTER, ONLY_BEFORE, Change, GrowthRule, compare
from harness.errors import UsageError
from harness.records import Record, Status
from harness.store import Store, read_file, record_key


class GateError(UsageError):
    """The gate has nothing to compare, or no current records (exit 2)."""


@dataclass
class GateResult:
    """Every (impl, case) change between the baseline and now, and the verdict."""

    changes: list[Change]
    baseline_builds: list[str]
    current_builds: list[str]

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.regression]

    @property
    def compared(self) -> list[Change]:
        return [c for c in self.changes if c.kind not in (ONLY_BEFORE, ONLY_AFTER)]

    @property
    def exit_code(self) -> int:
        """1 on any regression, 0 otherwise."""
        return 1 if self.regressions else 0


def load_baseline(path) -> list[Record]:
    """Records of a baseline file (``run --format json`` output or a store .jsonl file)."""
    records = read_file(path)
    if not records:
        raise GateError(f"baseline {path} holds no records: write one with `syncbn-harness run --format json "
                        f"> {path}` on the build you trust")
    return records


def stored_current(store_dir, key: str, impls: Sequence[str] = (), case_patterns: Sequence[str] = ()) -> list[Record]:
    """This build's records from the store, optionally only some impls and case patterns."""
    store = Store(store_dir)
    if key not in store.builds():
        present = ", ".join(store.builds()) or "none"
        raise GateError(f"the store {store_dir} holds no records of this build ({key}); builds present: "
                        f"{present}. Run `syncbn-harness run --store {store_dir}` first, or gate a fresh run by "
                        "leaving out --store")
    records = store.read(key)
    if impls:
        records = [r for r in records if r.impl in impls]
    if case_patterns:
        records = [r for r in records if any(fnmatch.fnmatchcase(r.case, p) for p in case_patterns)]
    return records


def evaluate(baseline: Sequence[Record], current: Sequence[Record], rule: GrowthRule = DEFAULT_RULE) -> GateResult:
    """Compare ``current`` with ``baseline``; refuse a comparison with no (impl, case) in common."""
    if not current:
        raise GateError("no current records to gate (the selection or the store filters left none)")
    result = GateResult(compare(baseline, current, rule), sorted({record_key(r) for r in baseline}),
                        sorted({record_key(r) for r in current}))
    if not result.compared:
        base_impls = sorted({r.impl for r in baseline})
        cur_impls = sorted({r.impl for r in current})
        raise GateError(f"the baseline and the current records share no (case, impl): baseline impls "
                        f"{base_impls} over {len(baseline)} records, current {cur_impls} over {len(current)}; "
                        "select the same cases and implementations as the baseline (--impl, --case)")
    return result


def format_result(result: GateResult, baseline_name: str) -> str:
    """What ``gate`` prints: the regressions, then the other changes, then the verdict."""
    lines = [f"gate: baseline {baseline_name} ({', '.join(result.baseline_builds)}) against "
             f"{', '.join(result.current_builds)}: {len(result.compared)} (case, impl) compared"]
    for c in result.regressions:
        lines.append(f"REGRESSION  {c.case}  [{c.impl}]  {c.describe()}")
    others = [c for c in result.changes if not c.regression and c.kind != "same"]
    for c in others:
        lines.append(f"{c.kind:<11} {c.case}  [{c.impl}]  {c.describe()}")
    n = len(result.regressions)
    lines.append(f"gate: {n} regression{'s' if n != 1 else ''}" + (" (exit 1)" if n else ", pass (exit 0)"))
    return "\n".join(lines)


def junit_rows(result: GateResult) -> list[dict]:
    """One JUnit testcase per (case, impl) of the current records (and baseline pairs not run now, skipped)."""
    rows = []
    for c in result.changes:
        rec = c.after or c.before
        row = {"classname": c.impl, "name": c.case, "time": rec.duration_s if c.after else 0.0}
        if c.regression:
            row.update(outcome="failure", type=c.kind if c.kind != "status change" else "regression",
                       message=f"regression against the baseline: {c.describe()}", detail=_detail(c.after))
        elif c.kind == ONLY_BEFORE:
            row.update(outcome="skipped", message="in the baseline but not in the current records")
        elif c.after.status != Status.PASS:
            why = "new case" if c.before is None else f"{c.before.status.value} in the baseline too"
            row.update(outcome="skipped", message=f"{c.after.status.value}, not a regression ({why}): "
                                                  f"{c.after.message[:300]}")
        else:
            row.update(outcome="pass")
        rows.append(row)
    return rows


def _detail(record: Optional[Record]) -> str:
    if record is None:
        return ""
    lines = [f"rank {o.rank}: {o.status} {o.exception_type or ''} {o.message}".strip() for o in record.ranks]
    bad = [f"{name}: err {m.get('max_abs_err')} tol {m.get('tol')} ratio {m.get('ratio')} {m.get('problem') or ''}"
           for name, m in record.metrics.items() if isinstance(m, dict) and not m.get("ok", True)]
    return "\n".join(lines + bad[:20])
