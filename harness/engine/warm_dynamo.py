"""Preloaded by the forkserver for selections that compile or build optimizers: see :mod:`harness.engine.warm`."""

from harness.engine import warm

warm.dynamo()
