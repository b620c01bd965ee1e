"""Bisection: over releases, wheels, interpreters, nightlies by day, overlaid commits; ``git bisect run`` scripts.

- :mod:`~harness.bisect.bisector`: the pure state machine, fed verdicts;
- :mod:`~harness.bisect.builds`: build SPECs, the ordered builds between two ends, what a build source is;
- :mod:`~harness.bisect.envs`: a cached virtual environment per build;
- :mod:`~harness.bisect.installer`: what installs a build into its environment (pip, or uv);
- :mod:`~harness.bisect.verdicts`: a build's verdict (the selection run in it) and its cache;
- :mod:`~harness.bisect.driver`: the bisection of builds from a build source, tying these together;
- :mod:`~harness.bisect.nightly`: nightlies by day, and what they were built from;
- :mod:`~harness.bisect.checkout`: a local pytorch checkout, read with git;
- :mod:`~harness.bisect.overlay`: a commit's Python laid over an installed torch (a build source);
- :mod:`~harness.bisect.syncbn_path`: which compiled files are on SyncBN's path (untestable by overlay);
- :mod:`~harness.bisect.commits`: the bisection of a checkout's commits as overlays;
- :mod:`~harness.bisect.answers`: what each mode answers (one :class:`~harness.bisect.answers.Answer` each);
- :mod:`~harness.bisect.script`: the script ``git bisect run`` calls in a checkout;
- :mod:`~harness.bisect.children`: child processes in their own process group, always reaped.
"""
