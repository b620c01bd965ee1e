"""The forkserver's last preload: what every rank would otherwise do at start, done once before any fork.

Importing this module (only the forkserver does, see :mod:`harness.engine.forkserver`) loads the
reference kernels when torch is a CPU build and they are built for it already (a missing build is left
to the ranks, which build it under the cache's lock and report a failure as the implementation's). It
never raises: whatever fails here, a rank does again and reports.
No thread is started, no tensor computed and CUDA never touched here (a CUDA build is left alone: asking
for a GPU would initialize CUDA, which a forked child cannot use), so forking afterwards is safe.
"""

from __future__ import annotations


def _warm() -> None:
    try:
        import torch

        if torch.version.cuda is not None:
            return
        from harness.kernels import extension

        extension.load_if_built()
    except Exception:  # noqa: BLE001 - best effort, the ranks redo it
        pass


_warm()
