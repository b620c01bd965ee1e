"""Lightning#7026 undone in every Python process that starts with this folder on ``PYTHONPATH``.

Python imports ``sitecustomize`` at start-up; this one (put on the path of a test's rank processes only, by
tests/undo/test_library_fixes.py) recompiles Lightning's ``_AcceleratorConnector._lazy_init_strategy`` from the
installed source with the behaviour before Lightning#7026 written over it: the Trainer's layer sync
(``sync_batchnorm=True``) reaches only a strategy the Trainer made itself, not one passed by hand
(:mod:`source_edits`). Nothing else changes; a process without this folder on its path runs Lightning as
installed.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/support: source_edits

from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector  # noqa: E402
from source_edits import edited_method  # noqa: E402

# The method's source, dedented: its body is indented by four spaces.
HAND_PASSED_GETS_NONE = [['    if hasattr(self.strategy, "_layer_sync"):\n',
                          '    if hasattr(self.strategy, "_layer_sync") and not isinstance(self._strategy_flag, '
                          'Strategy):\n']]

_AcceleratorConnector._lazy_init_strategy = edited_method(_AcceleratorConnector, "_lazy_init_strategy",
                                                          HAND_PASSED_GETS_NONE)
