"""The reference SyncBN extension: its C++/CUDA sources and the Python that builds and describes them.

This folder ships as the package ``harness.kernels`` so that the sources are
found after any kind of install.

- ``ops.cpp``: the op schemas (``TORCH_LIBRARY(syncbn_ref, ...)``), defined once;
- ``common.h``: the argument checks the CPU and CUDA kernels share;
- ``cpu/``, ``cuda/``: one ``TORCH_LIBRARY_IMPL`` per backend;
- :mod:`~harness.kernels.extension`: the JIT build, cached per torch build and source, and the loader;
- :mod:`~harness.kernels.fake`: fake (meta) kernels for FakeTensor, ``opcheck`` and ``torch.compile``.
"""

from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parent
SCHEMA_SOURCES = [SOURCE_DIR / "ops.cpp"]
CPU_SOURCES = sorted((SOURCE_DIR / "cpu").glob("*.cpp"))
CUDA_SOURCES = sorted((SOURCE_DIR / "cuda").glob("*.cu"))
HEADERS = sorted(SOURCE_DIR.rglob("*.h")) + sorted(SOURCE_DIR.rglob("*.cuh"))
