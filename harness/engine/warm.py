"""The forkserver's last preloads: what every rank would otherwise do at start, done once before any fork.

Importing this module does nothing but define them. The forkserver's preload ends with
:mod:`harness.engine.warm_server`, which calls :func:`kernels` (the reference kernels, when they are built
for this torch already: a missing build is left to the ranks, which build it under the cache's lock and
report a failure as the implementation's) and registers :func:`exit_fast`, so that the forkserver exits
without the interpreter's teardown: it outlives the command that started it by as long as that teardown
takes (half a second of CPU with torch loaded), which the next command (a ``git bisect run`` step, a
benchmark's next turn) would pay. :mod:`harness.engine.warm_dynamo`, preloaded for selections that compile
or build optimizers, calls :func:`dynamo`: dynamo, its backends and inductor's compiler.

The kernels and dynamo are loaded where no GPU can be reached (:func:`preload_is_safe`): a CPU build of
torch, or a GPU build on a machine without a GPU device file. Elsewhere anything that asked for a GPU
would initialize CUDA in the forkserver, which its forked ranks could then not use, so ranks do it
themselves there (a CUDA build on a CPU-only machine, as in CI's cross-build run, restarted every pool
with each rank importing dynamo again: 4-6 s a restart).
Nothing here raises (whatever fails, a rank does again and reports), starts a thread or computes a
tensor, so forking afterwards is safe.
"""

from __future__ import annotations

import glob
import os
import sys


# What a process opens to reach a GPU: NVIDIA's device files, ROCm's, WSL's GPU paravirtualization.
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/nvidia[0-9]*", "/dev/kfd", "/dev/dxg")


def preload_is_safe() -> bool:
    """Whether nothing here could initialize a GPU: torch is a CPU build, or this machine has no GPU device file."""
    import torch

    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return True
    return not any(glob.glob(pattern) for pattern in GPU_DEVICE_FILES)


def kernels() -> None:
    """Load the reference kernels if they are built for this torch (never compiles)."""
    try:
        if preload_is_safe():
            from harness.kernels import extension

            extension.load_if_built()
    except Exception:  # noqa: BLE001 - best effort, the ranks redo it
        pass


# What dynamo imports on a process's first compile of a SyncBN (measured on torch 2.13: 34 modules, these
# and what they import), which every fresh rank would otherwise import again after each pool restart: the
# compile family's run takes 5-10% less with them preloaded.
FIRST_COMPILE = ("torch.export._trace", "torch.fx.experimental.validator", "torch.distributed.tensor.experimental",
                 "torch._inductor.compiler_bisector", "torch._subclasses.schema_check_mode", "sympy.tensor.tensor")


def dynamo() -> None:
    """Import dynamo, every registered backend's module (0.2 s), inductor's compiler (0.6 s) and
    :data:`FIRST_COMPILE` (modules missing from a build are skipped)."""
    import importlib

    try:
        if preload_is_safe():
            from harness.engine.compiled import lookup_backend

            lookup_backend("eager")
            import torch._inductor.compile_fx  # noqa: F401
            for name in FIRST_COMPILE:
                try:
                    importlib.import_module(name)
                except ImportError:
                    pass
    except Exception:  # noqa: BLE001 - best effort, the ranks redo it
        pass


def exit_fast(server_pid: int) -> None:
    """At exit of process ``server_pid`` (the forkserver), flush and leave without the interpreter's teardown.

    The forkserver exits when the process that started it closes their pipe: nothing of its state needs
    tearing down. Its forked ranks never run atexit handlers (multiprocessing ends them with ``os._exit``);
    the pid check makes sure of it.
    """
    if os.getpid() != server_pid:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)

