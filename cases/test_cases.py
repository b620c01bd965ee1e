"""The catalog as pytest items: each (case, implementation) must pass, or be a known upstream issue."""

from __future__ import annotations

import warnings

import pytest

from harness.judge.status import NOT_RUN, Status


class KnownIssueNowPasses(UserWarning):
    """A known-issues entry whose case passes: the entry can be retired."""


def test_case(harness_session, harness_case, impl_adapter):
    record = harness_session.run_one(harness_case, impl_adapter)
    if record.status in NOT_RUN:
        pytest.skip(f"{record.status.value}: {record.message}")
    if record.known:
        pytest.xfail(f"known issue ({record.known_issue.link}): {record.status.value}: {record.message}")
    if record.known_issue and record.known_issue.now_passes:
        warnings.warn(KnownIssueNowPasses(f"{record.case} [{record.impl}] passes; known issue "
                                          f"{record.known_issue.link} may be fixed: retire its entry in "
                                          "cases/known_issues.toml"), stacklevel=1)
    if record.status != Status.PASS:
        ranks = "\n".join("  " + o.line() for o in record.ranks)
        pytest.fail(f"{record.status.value}: {record.message}\n{ranks}", pytrace=False)
