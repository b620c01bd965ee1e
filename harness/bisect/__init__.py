"""Bisection: over releases, wheels or interpreters, and as ``git bisect run`` scripts.

- :mod:`~harness.bisect.bisector`: the pure state machine, fed verdicts;
- :mod:`~harness.bisect.builds`: build SPECs and the ordered builds between two ends;
- :mod:`~harness.bisect.envs`: a cached virtual environment per build;
- :mod:`~harness.bisect.verdicts`: a build's verdict (the selection run in it) and its cache;
- :mod:`~harness.bisect.driver`: the bisection of builds, tying these together;
- :mod:`~harness.bisect.script`: the script ``git bisect run`` calls in a checkout;
- :mod:`~harness.bisect.children`: child processes in their own process group, always reaped.
"""
