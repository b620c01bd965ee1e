"""``syncbn-harness fidelity --emulated STORE --native STORE``: cpu-emulation verdicts against CUDA's, case by case."""

from __future__ import annotations

import click

from harness.commands import cli


@cli.command()
@click.option("--emulated", "emulated_dir", type=click.Path(file_okay=False, exists=True), required=True,
              metavar="STORE", help="A store holding the implementation's records made on CPU (cpu-emulation).")
@click.option("--native", "native_dir", type=click.Path(file_okay=False, exists=True), required=True,
              metavar="STORE", help="A store holding its records of the same cases made with --device cuda.")
@click.option("--impl", "impls", multiple=True, default=("torch",), show_default=True,
              help="The implementation whose records are compared (repeatable).")
@click.option("--out", "out_file", type=click.Path(dir_okay=False), default=None,
              help="Also write the table (markdown) to this file.")
def fidelity(emulated_dir, native_dir, impls, out_file):
    """List every case whose CPU record disagrees with its CUDA record (status, dtype, layout, shape).

    For torch the CPU records are its cpu-emulation (its Python over CPU stand-ins for its CUDA kernels); for the
    reference, its CPU kernels against its CUDA kernels.

    Both stores must hold records of one torch build (version and git commit); different builds are refused (exit
    2). Informational otherwise: exit 0 whatever it finds. Each row is an emulation defect to fix or a difference to
    explain.
    """
    from harness.errors import UsageError
    from harness.results.fidelity import build_mismatch, compare, to_markdown
    from harness.results.store import Store

    emulated, native = Store(emulated_dir).read(), Store(native_dir).read()
    for impl in impls:
        if not any(r.impl == impl and r.device == "cpu" for r in emulated):
            raise UsageError(f"--emulated {emulated_dir}: no {impl} record made on CPU there; make them with "
                             f"`syncbn-harness run --device cpu --impl {impl} --store {emulated_dir}`")
        if not any(r.impl == impl and r.device == "cuda" for r in native):
            raise UsageError(f"--native {native_dir}: no {impl} record made on CUDA there; make them on a GPU with "
                             f"`syncbn-harness run --device cuda --backend gloo --impl {impl} --store {native_dir}`")
        differ = build_mismatch(emulated, native, impl)
        if differ:
            raise UsageError(f"--emulated {emulated_dir} and --native {native_dir} hold different torch builds ("
                             f"{differ}): make the cpu-emulation records with the same torch, e.g. on the GPU machine "
                             f"itself (`syncbn-harness run --device cpu --impl {impl} --store STORE`)")
    text = "\n".join(to_markdown(compare(emulated, native, impl)) for impl in impls)
    click.echo(text, nl=False)
    if out_file:
        with open(out_file, "w", encoding="utf-8") as f:
            f.write(text)
