"""``syncbn-harness build-apex --src CHECKOUT``: build apex's optimized SyncBatchNorm extension from a checkout."""

from __future__ import annotations

from pathlib import Path

import click

from harness.commands import cli


@cli.command("build-apex")
@click.option("--src", type=click.Path(file_okay=False, exists=True), required=True, metavar="CHECKOUT",
              help="An apex checkout from before NVIDIA/apex PR #1896 (which removed apex.parallel).")
@click.option("--cuda-arch", default=None, metavar="LIST",
              help='CUDA architectures, e.g. "9.0" (default: the GPUs present).')
@click.option("--verbose", is_flag=True, help="Show the compiler's output.")
def build_apex(src, cuda_arch, verbose):
    """Build apex's `syncbn` extension (only that one) for this torch build; print the PYTHONPATH that uses it.

    With that PYTHONPATH, `--impl apex` runs apex's optimized SyncBatchNorm (`syncbn-harness env` says so).
    """
    import time

    import torch

    from harness.errors import UsageError
    from harness.impls.apex_build import build_syncbn, pythonpath

    if cuda_arch is None:
        if not torch.cuda.is_available():
            raise UsageError("build-apex: torch sees no GPU to build for; give --cuda-arch (e.g. 9.0)")
        cuda_arch = ";".join(sorted({"%d.%d" % torch.cuda.get_device_capability(i)
                                     for i in range(torch.cuda.device_count())}))
    t0 = time.perf_counter()
    built = build_syncbn(Path(src), cuda_arch, verbose=verbose)
    click.echo(f"built apex's syncbn for sm {cuda_arch} in {time.perf_counter() - t0:.1f}s: {built}")
    click.echo(f"PYTHONPATH={pythonpath(Path(src), built)}")
