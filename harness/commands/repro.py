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
@click.option("--long", "long_form", is_flag=True,
              help="The generated form: the harness's own code for the case (any case, any failure, the "
                   "harness's tolerances) instead of the short issue-ready file.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None,
              help="Device the harness runs the case on first (default: cuda if available, else cpu); with "
                   "--long, the file's device (default: cuda for torch).")
@click.option("--no-run", is_flag=True, help="--long only: do not run the case with the harness first.")
@click.option("--no-verify", is_flag=True, help="Do not run the short file once after writing it.")
@click.option("--cpu-demo", is_flag=True,
              help="torch only: a CPU demonstration instead of the file that is evidence: torch's SyncBatchNorm over "
                   "plain-torch stand-ins for its CUDA ops, labelled as such (the evidence file needs a GPU).")
@click.option("--timeout", type=click.FloatRange(min=1), default=300.0, help="Seconds for the whole case.")
def repro(case_id, impl_name, output, long_form, device, no_run, no_verify, timeout, cpu_demo):
    """Write one standalone Python file that reproduces CASE for --impl (run it with python FILE).

    The default is the short form: the one symptom the harness observes, checked against torch.nn.BatchNorm
    in float64 with only torch and the library installed; it exits 1 while the symptom shows, 0 once fixed, 2
    when it cannot tell (torch's file, without a GPU, says it needs one).
    """
    from harness.repro import Form, write_repro

    written = write_repro(case_id, impl_name, output=output, device=device, run_first=not no_run,
                          timeout=timeout, command="syncbn-harness " + shlex.join(sys.argv[1:]),
                          long=long_form, verify=not no_verify, cpu_demo=cpu_demo)
    seen = f"observed {written.record.status.value}" if written.record is not None else "not run"
    click.echo(f"wrote {written.path} ({written.form.value} form, {seen}); run it with: python {written.path}")
    if written.form is Form.SHORT:
        click.echo(f"the file {written.verdict()}")
