"""Preloaded last by every forkserver: the reference kernels (when built already) and an exit without teardown.

Importing it makes the importing process leave at exit without running the exit handlers registered before
it (:func:`harness.engine.warm.exit_fast`), so only the forkserver's preload names it: a process that keeps
state to clean up at exit (multiprocessing's temporary folder, a test runner's worker) must not import it.
"""

import atexit
import os

from harness.engine import warm

warm.kernels()
atexit.register(warm.exit_fast, os.getpid())
