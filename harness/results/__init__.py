"""Results: records as data, where they are kept, and what is made of them.

- :mod:`~harness.results.records`: statuses, rank outcomes, records, the exit code of a run;
- :mod:`~harness.results.evidence`: the shapes of a record's compare, desync, diagnosis and compile fields;
- :mod:`~harness.results.verdict`: good, bad or untestable over a build's records (``check`` and ``bisect``);
- :mod:`~harness.results.known_issues`: the known-issues file, matched to records by their
  :mod:`~harness.results.symptoms` (each way a record failed, in one line);
- :mod:`~harness.results.reader`: the one reader of stored records (schema migrations, torn lines);
- :mod:`~harness.results.store`: the append-only JSON Lines store, one file per build, and the questions it
  answers (the latest records, counts, a sample), narrowed by :mod:`~harness.results.where`;
- :mod:`~harness.results.index`: a derived, deletable SQLite index of a store, for reports in bounded memory;
- :mod:`~harness.results.compaction`: the store's housekeeping (what each build file holds; keeping what is read);
- :mod:`~harness.results.fingerprint`: a record's collective fingerprint, and how it changed between builds;
- :mod:`~harness.results.compile_stats`: what ``torch.compile`` did in a record;
- :mod:`~harness.results.timeline`: an overlay bisection's builds in commit order;
- :mod:`~harness.results.diff`: what changed between two builds;
- :mod:`~harness.results.gate`: the CI verdict against a baseline;
- :mod:`~harness.results.report`: HTML, Markdown and CSV over the store, from :mod:`~harness.results.page`
  (what a report shows), :mod:`~harness.results.frames` (records as pandas frames) and
  :mod:`~harness.results.plots` (error against tolerance);
- :mod:`~harness.results.severity`: a failure's severity and reach;
- :mod:`~harness.results.fidelity`: records made on CPU (cpu-emulation) set against CUDA's, case by case;
- :mod:`~harness.results.console`, :mod:`~harness.results.progress`, :mod:`~harness.results.junit`: what a
  run prints for people, draws on a terminal, and writes for CI systems.
"""
