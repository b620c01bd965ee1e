"""``search --budget``: durations parse, and a bad one names the fix (without processes)."""

from __future__ import annotations

import pytest


def test_budget_durations_parse_and_bad_ones_name_the_fix():
    from harness.commands.search import parse_duration
    from harness.errors import UsageError

    assert parse_duration("300") == 300 and parse_duration("90s") == 90
    assert parse_duration("10m") == 600 and parse_duration("1.5h") == 5400
    for bad in ("", "ten", "5d", "0", "-3m"):
        with pytest.raises(UsageError, match="10m"):
            parse_duration(bad)
