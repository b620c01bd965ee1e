"""Results: records as data, where they are kept, and what is made of them.

- :mod:`~harness.results.records`: statuses, rank outcomes, records, the exit code of a run;
- :mod:`~harness.results.evidence`: the shapes of a record's compare, desync, diagnosis and compile fields;
- :mod:`~harness.results.verdict`: good, bad or untestable over a build's records (``check`` and ``bisect``);
- :mod:`~harness.results.known_issues`: the known-issues file, matched to records;
- :mod:`~harness.results.store`: the append-only JSON Lines store, one file per build;
- :mod:`~harness.results.diff`: what changed between two builds;
- :mod:`~harness.results.gate`: the CI verdict against a baseline;
- :mod:`~harness.results.report`: HTML, Markdown and CSV over the store;
- :mod:`~harness.results.severity`: a failure's severity and reach;
- :mod:`~harness.results.fidelity`: records made on CPU (cpu-emulation) set against CUDA's, case by case;
- :mod:`~harness.results.console`, :mod:`~harness.results.progress`, :mod:`~harness.results.junit`: what a
  run prints for people, draws on a terminal, and writes for CI systems.
"""
