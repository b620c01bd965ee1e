"""``syncbn-harness repro``: one standalone Python file reproducing a case for an implementation."""

from __future__ import annotations

import shlex
import sys

import click

from harness.commands import cli


@cli.command()
@click.argument("case_id", metavar="CASE")
@click.option("--impl", "impl_name", required=True, metavar="NAME",
              help="reference, torch, apex, a registered plugin, or MODULE:ATTR.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Where to write the file (default: repro_<case>_<impl>.py here).")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None,
              help="Device of the file (default: cuda for torch, else cuda if available, else cpu).")
@click.option("--no-run", is_flag=True, help="Do not run the case with the harness first (the header then "
              "reports no observation).")
@click.option("--timeout", type=click.FloatRange(min=1), default=300.0, help="Seconds for the whole case.")
def repro(case_id, impl_name, output, device, no_run, timeout):
    """Write one standalone Python file that reproduces CASE for --impl (python FILE, or torchrun)."""
    from harness.repro import write_repro

    path, record = write_repro(case_id, impl_name, output=output, device=device, run_first=not no_run,
                               timeout=timeout, command="syncbn-harness " + shlex.join(sys.argv[1:]))
    seen = f"observed {record.status.value}" if record is not None else "not run"
    click.echo(f"wrote {path} ({seen}); run it with: python {path}")
