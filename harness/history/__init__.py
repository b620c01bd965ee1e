"""SyncBN across torch releases: a history run, the known issues' release ranges, the page.

- :mod:`~harness.history.releases`: which releases (the latest patch of each minor release in a range);
- :mod:`~harness.history.collect`: the selection run in an environment per release, into one store;
- :mod:`~harness.history.table`: the history as one small committed file, a row per (release, impl, case);
- :mod:`~harness.history.ranges`: where each known issue shows, against the releases its entry states;
- :mod:`~harness.history.fixes`: upstream changes with a known release, checked against the history;
- :mod:`~harness.history.changes`: every status change between consecutive releases, and what explains it;
- :mod:`~harness.history.page`: the page (Markdown and HTML) made of those tables;
- :mod:`~harness.history.report`: ``report --history``: the history file, then its page.
"""
