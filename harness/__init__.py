"""syncbn-harness: regression and bisection harness for SyncBatchNorm implementations.

The package, lowest layer first (a module imports only from layers below it; tests/test_layout.py checks):

- :mod:`~harness.errors` (errors a user can fix), :mod:`~harness.paths` (where things live, every
  ``SYNCBN_HARNESS_*`` variable);
- :mod:`~harness.procs`: child processes in sessions of their own, stopped as a group, always reaped;
- :mod:`~harness.cache`: what the cache holds, and pruning it;
- :mod:`~harness.slices`: large tensors a batch slice at a time;
- :mod:`~harness.catalog` (with ``cases/``): the cases and selection over them;
- ``kernels/`` (``harness.kernels``): the reference's C++/CUDA extension;
- :mod:`~harness.judge`: the float64 truth, tolerances, metrics;
- :mod:`~harness.impls`: the adapters under test;
- :mod:`~harness.results`: records, the store, reports, the gate;
- :mod:`~harness.buildinfo`: the build under test;
- :mod:`~harness.selection`: flags to cases, adapters and run options;
- :mod:`~harness.scenarios`: what a rank does with a case;
- :mod:`~harness.engine`: pools of ranks, torchrun, attribution, the run plan;
- :mod:`~harness.repro`: standalone repro files;
- :mod:`~harness.search` (cases nobody listed) and :mod:`~harness.bisect` (builds and commits);
- :mod:`~harness.history`: the selection across torch releases, the known issues' ranges, its page;
- :mod:`~harness.bench`: benchmarks, each a ratio against a baseline measured in the same run;
- :mod:`~harness.gpu_suite`: everything CUDA on a GPU machine, bounded and packed;
- :mod:`~harness.undo`: torch's own SyncBatchNorm fixes undone, and its code mutated, judged by the cases;
- :mod:`~harness.commands`: the command line (``python -m harness``: ``__main__``).
"""

__version__ = "0.3.0"

# Version of the record format (harness.results.records); bump on any incompatible change, with a migration
# in harness.results.reader.
SCHEMA_VERSION = 3
