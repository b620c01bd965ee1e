"""The catalog as pytest items: each (case, implementation) must pass, or be a known upstream issue."""

from __future__ import annotations

import warnings

import pytest

from harness.records import Status


class KnownIssueNowPasses(UserWarning):
    """A known-issues entry whose case passes: the entry can be retired."""


def test_case(harness_session, harness_case, impl_adapter):
    record = harness_session.run_one(harness_case, impl_adapter)
    known = record.known_issue or {}
    if record.status in (Status.SKIPPED, Status.UNSUPPORTED):
        pytest.skip(f"{record.status.value}: {record.message}")
    if known.get("matched"):
        pytest.xfail(f"known issue ({known['link']}): {record.status.value}: {record.message}")
    if known.get("now_passes"):
        warnings.warn(KnownIssueNowPasses(f"{record.case} [{record.impl}] passes; known issue {known['link']} "
                                          "may be fixed: retire its entry in cases/known_issues.toml"), stacklevel=1)
    if record.status != Status.PASS:
        ranks = "\n".join(f"  rank {o.rank}: {o.status} {o.exception_type or ''} {o.message}".rstrip()
                          for o in record.ranks)
        pytest.fail(f"{record.status.value}: {record.message}\n{ranks}", pytrace=False)
