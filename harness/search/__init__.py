"""``search``: find what nobody listed, at the sizes users train at.

- :mod:`~harness.search.space`: the hypothesis strategy of generated layer cases and their IDs;
- :mod:`~harness.search.systems`: the strategy of generated training-system cases (networks, DDP, conversion,
  compile, the training uses), ``--system``;
- :mod:`~harness.search.signature`: how a record fails, in a few words (a finding's symptoms; what known
  findings are tallied by);
- :mod:`~harness.search.cause`: where a failure starts and what its case needs: what findings are grouped by
  (one per cause) and what shrinking keeps;
- :mod:`~harness.search.rules`: the decisions, pure: what an explored case's records yield, which record is the
  shrink's target, when a shrink or the exploration stops; the findings and the shrink as data;
- :mod:`~harness.search.explore`: rounds of exploration and shrinking on warm pools, memoized and budgeted;
- :mod:`~harness.search.findings`: the summary (Markdown, JSON) and a repro file per finding;
- :mod:`~harness.search.promote`: a finding's minimal case into the catalog (the ``search`` family).
"""
