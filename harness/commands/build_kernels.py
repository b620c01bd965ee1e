"""``syncbn-harness build-kernels``: prebuild the reference extension."""

from __future__ import annotations


import click

from harness.commands import cli


@cli.command("build-kernels")
@click.option("--cuda/--no-cuda", default=None, help="Include the CUDA sources (default: when a GPU is present).")
@click.option("--cuda-arch", default=None, metavar="LIST",
              help='CUDA architectures, e.g. "8.0;9.0" (default: this GPU, or 8.0;9.0 with none).')
@click.option("--verbose", is_flag=True, help="Show the compiler's output.")
def build_kernels(cuda, cuda_arch, verbose):
    """Prebuild the reference extension for this torch build (cached per build and source)."""
    import time

    from harness.kernels import extension

    spec = extension.default_spec(cuda=cuda, cuda_archs=cuda_arch)
    t0 = time.perf_counter()
    path = extension.build(spec, verbose=verbose)
    what = f"CPU + CUDA ({spec.cuda_archs or 'this GPU'})" if spec.with_cuda else "CPU"
    click.echo(f"built {what} kernels in {time.perf_counter() - t0:.1f}s: {path}")
