"""Nsight Compute profiles of the reference's CUDA kernels beside torch's, on the same tensors.

``python -m harness.gpu_suite.profile --ncu PATH --out DIR`` runs this module
again as ``--target`` under ``ncu``: for each shape of :data:`SHAPES` every
op of the reference (``syncbn_ref::welford_stats`` and the four ATen-contract
ops it shares with torch) and torch's own op runs once on the same tensors,
after a warm-up, inside an NVTX range named ``<shape>: <impl> <op>``, itself
inside one range :data:`RANGE`. ``ncu`` profiles only what runs inside that
range, names each kernel after its innermost range (``--print-nvtx-rename
kernel``), keeps the clocks as it finds them
(``--clock-control none``) and collects speed of light, launch statistics and
occupancy. ``DIR/ncu.csv`` is ``ncu``'s raw output; ``DIR/ncu.md`` a table of
each kernel's time, DRAM and SM throughput, registers and achieved occupancy
(:func:`summarize`, pure).
"""

from __future__ import annotations

import argparse
import csv
import io
import subprocess
import sys
from pathlib import Path
from typing import Optional

RANGE = "syncbn-profile"
SHAPES = (("N16 C256 56x56 float32 contiguous", (16, 256, 56, 56), "float32", "contiguous"),
          ("N16 C256 56x56 float16 channels_last", (16, 256, 56, 56), "float16", "channels_last"),
          ("N2 C2048 2-D float32", (2, 2048), "float32", "contiguous"))
METRICS = ("Duration", "DRAM Throughput", "Compute (SM) Throughput", "Registers Per Thread", "Achieved Occupancy")
TIMEOUT_S = 80


def target() -> None:
    """Run every op once per shape inside its NVTX range (the process ``ncu`` profiles)."""
    import torch

    from harness.kernels import extension

    extension.load()
    ref = torch.ops.syncbn_ref
    eps = 1e-5
    for label, shape, dtype, layout in SHAPES:
        g = torch.Generator().manual_seed(0)
        dt = getattr(torch, dtype)
        fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
        x = (torch.randn(shape, generator=g) * 2 + 1).to("cuda", dt).contiguous(memory_format=fmt)
        dy = torch.randn(shape, generator=g).to("cuda", dt).contiguous(memory_format=fmt)
        c = shape[1]
        w, b = torch.randn(c, device="cuda"), torch.randn(c, device="cuda")
        mean, invstd = torch.batch_norm_stats(x, eps)
        sum_dy, sum_dy_xmu, _, _ = torch.batch_norm_backward_reduce(dy, x, mean, invstd, w, True, True, True)
        count = torch.tensor([x.numel() // c], dtype=torch.int32, device="cuda")
        calls = _calls(ref, x, dy, w, b, mean, invstd, sum_dy, sum_dy_xmu, count, eps)
        for call in calls.values():  # warm-up: module load and first-launch costs stay out of the profile
            call()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push(RANGE)
        for (impl, op), call in calls.items():
            torch.cuda.nvtx.range_push(f"{label}: {impl} {op}")  # no '/': ncu reads it as nesting
            call()
            torch.cuda.nvtx.range_pop()
        torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()


def _calls(ref, x, dy, w, b, mean, invstd, sum_dy, sum_dy_xmu, count, eps) -> dict:
    """(impl, op) -> a call of that op on these tensors, the reference's and torch's side by side."""
    import torch

    return {
        ("reference", "welford_stats"): lambda: ref.welford_stats(x),
        ("reference", "batch_norm_stats"): lambda: ref.batch_norm_stats(x, eps),
        ("torch", "batch_norm_stats"): lambda: torch.batch_norm_stats(x, eps),
        ("reference", "batch_norm_elemt"): lambda: ref.batch_norm_elemt(x, w, b, mean, invstd, eps),
        ("torch", "batch_norm_elemt"): lambda: torch.batch_norm_elemt(x, w, b, mean, invstd, eps),
        ("reference", "batch_norm_backward_reduce"):
            lambda: ref.batch_norm_backward_reduce(dy, x, mean, invstd, w, True, True, True),
        ("torch", "batch_norm_backward_reduce"):
            lambda: torch.batch_norm_backward_reduce(dy, x, mean, invstd, w, True, True, True),
        ("reference", "batch_norm_backward_elemt"):
            lambda: ref.batch_norm_backward_elemt(dy, x, mean, invstd, w, sum_dy, sum_dy_xmu, count),
        ("torch", "batch_norm_backward_elemt"):
            lambda: torch.batch_norm_backward_elemt(dy, x, mean, invstd, w, sum_dy, sum_dy_xmu, count),
    }


def summarize(raw: str) -> str:
    """A Markdown table of ``ncu --csv --page details`` output: one row per kernel, the :data:`METRICS` (pure)."""
    rows = list(csv.DictReader(io.StringIO(raw[raw.find('"ID"'):] if '"ID"' in raw else raw)))
    if not rows or "Kernel Name" not in rows[0]:
        return "ncu gave no kernel table (see ncu.csv and the step's log)\n"
    kernels: dict[str, dict] = {}
    for row in rows:
        k = kernels.setdefault(row["ID"], {"name": row["Kernel Name"], "block": row.get("Block Size", ""),
                                           "grid": row.get("Grid Size", "")})
        name = row.get("Metric Name", "")
        if name in METRICS:
            k[name] = f"{row.get('Metric Value', '')} {row.get('Metric Unit', '')}".strip()
    out = ["| kernel (NVTX range) | block | grid | " + " | ".join(METRICS) + " |",
           "| --- |" + " --- |" * (2 + len(METRICS))]
    for _, k in sorted(kernels.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else kv[0]):
        name = k["name"].replace("|", "\\|")
        out.append(f"| {name} | {k['block']} | {k['grid']} | " + " | ".join(k.get(m, "") for m in METRICS) + " |")
    return "\n".join(out) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", action="store_true", help="run the ops (what ncu profiles)")
    parser.add_argument("--ncu", default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.target:
        target()
        return 0
    if not args.ncu or not args.out:
        parser.error("--ncu and --out are needed (or --target)")
    args.out.mkdir(parents=True, exist_ok=True)
    cmd = [args.ncu, "--clock-control", "none", "--nvtx", "--nvtx-include", f"{RANGE}/", "--print-nvtx-rename",
           "kernel", "--section", "SpeedOfLight", "--section", "LaunchStats", "--section", "Occupancy", "--csv",
           "--page", "details", sys.executable, "-m", "harness.gpu_suite.profile", "--target"]
    print(" ".join(cmd), flush=True)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        print(f"ncu did not finish in {TIMEOUT_S}s: {exc}")
        return 1
    (args.out / "ncu.csv").write_text(proc.stdout, encoding="utf-8")
    table = summarize(proc.stdout)
    (args.out / "ncu.md").write_text(table, encoding="utf-8")
    print(proc.stderr[-4000:])
    print(table)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
