"""The forkserver's last preload: what every rank would otherwise do at start, done once before any fork.

Importing this module (only the forkserver does, see :mod:`harness.engine.forkserver`) loads the
reference kernels when torch is a CPU build and they are built for it already (a missing build is left
to the ranks, which build it under the cache's lock and report a failure as the implementation's). It
never raises: whatever fails here, a rank does again and reports. Where dynamo is preloaded (see
:func:`harness.engine.forkserver.preload`), it also imports dynamo's backends and inductor's compiler.
No thread is started, no tensor computed and CUDA never touched here (a CUDA build is left alone: asking
for a GPU would initialize CUDA, which a forked child cannot use), so forking afterwards is safe.
"""

from __future__ import annotations

import sys


def _warm() -> None:
    try:
        import torch

        if torch.version.cuda is not None:
            return
        from harness.kernels import extension

        extension.load_if_built()
    except Exception:  # noqa: BLE001 - best effort, the ranks redo it
        return
    if "torch._dynamo" not in sys.modules:  # preloaded only for selections that compile or build optimizers
        return
    try:
        import torch._dynamo

        torch._dynamo.lookup_backend("eager")  # imports every registered backend's module (0.2 s)
        import torch._inductor.compile_fx  # noqa: F401 - what compiling with inductor imports first (0.6 s)
    except Exception:  # noqa: BLE001 - best effort, the ranks redo it
        pass


_warm()
