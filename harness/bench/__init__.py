"""Benchmarks: every figure is a ratio against a baseline measured in the same run.

- :mod:`~harness.bench.timing`: the in-process timers (wall time on CPU, CUDA events on a GPU);
- :mod:`~harness.bench.kernels`: ``bench kernels`` on CPU, the reference's ops against torch's and a copy;
- :mod:`~harness.bench.device_kernels`: ``bench kernels --device cuda``, the reference's CUDA kernels against
  torch's native ones;
- :mod:`~harness.bench.pool`: ``bench pool``, the warm pool against a fresh process group per case;
- :mod:`~harness.bench.commands`: ``bench run``, whole commands of this tree against a baseline commit's, its
  table of figures and the command timer;
- :mod:`~harness.bench.store`: ``bench store``, ``report`` and the per-build reader over synthetic stores.
"""
