"""Sources of the reference SyncBN extension (C++ for CPU, CUDA for GPUs).

This folder ships as the package ``harness.kernels`` so that the sources are
found after any kind of install; :mod:`harness.extension` builds them.
"""

from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parent
SCHEMA_SOURCES = [SOURCE_DIR / "ops.cpp"]
CPU_SOURCES = sorted((SOURCE_DIR / "cpu").glob("*.cpp"))
CUDA_SOURCES = sorted((SOURCE_DIR / "cuda").glob("*.cu"))
HEADERS = sorted(SOURCE_DIR.rglob("*.h")) + sorted(SOURCE_DIR.rglob("*.cuh"))
