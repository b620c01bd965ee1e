"""The Nsight Compute step: its table from ncu's CSV (ncu itself runs only on the GPU machine).

Design: ``summarize`` is pure; the input is ncu's ``--csv --page details`` format as ncu 2025 prints it
(one row per kernel and metric, after ncu's own ``==PROF==`` lines), written here by hand since ncu cannot run
without a GPU.
"""

from __future__ import annotations

import pytest

from harness.gpu_suite import profile

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def row(kid, kernel, section, metric, unit, value):
    return (f'"{kid}","1","python3","127.0.0.1","{kernel}","1","7","(256, 1, 1)","(132, 1, 1)","0","9.0",'
            f'"{section}","{metric}","{unit}","{value}"')


def test_the_table_has_one_row_per_kernel_with_its_metrics():
    raw = "\n".join(["==PROF== Connected to process 1", "some output of the program", HEADER,
                     row(0, "N8 C2048 2-D float32: reference welford_stats", "GPU Speed Of Light Throughput",
                         "Duration", "usecond", "4.10"),
                     row(0, "N8 C2048 2-D float32: reference welford_stats", "GPU Speed Of Light Throughput",
                         "DRAM Throughput", "%", "12.5"),
                     row(0, "N8 C2048 2-D float32: reference welford_stats", "Launch Statistics",
                         "Registers Per Thread", "register/thread", "38"),
                     row(0, "N8 C2048 2-D float32: reference welford_stats", "Launch Statistics",
                         "Shared Memory", "Kbyte", "1.02"),
                     row(1, "N8 C2048 2-D float32: torch batch_norm_stats", "Occupancy", "Achieved Occupancy", "%",
                         "81.2")])
    table = profile.summarize(raw).splitlines()
    assert table[0].startswith("| kernel (NVTX range) | block | grid | Duration | DRAM Throughput |")
    assert table[2] == ("| N8 C2048 2-D float32: reference welford_stats | (256, 1, 1) | (132, 1, 1) | 4.10 usecond "
                        "| 12.5 % |  | 38 register/thread |  |")
    assert table[3].endswith("|  |  |  |  | 81.2 % |") and len(table) == 4


def test_no_kernel_table_says_so_and_the_command_needs_ncu():
    assert "no kernel table" in profile.summarize("==ERROR== the profiler could not start\n")
    with pytest.raises(SystemExit):
        profile.main(["--out", "/tmp/x"])
