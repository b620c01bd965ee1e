"""``syncbn-harness bisect``: the first bad build between a good and a bad one.

Three modes, by what ``--good`` and ``--bad`` name:
- releases, wheels or interpreters (:func:`harness.bisect.driver.bisect_builds`);
- nightlies, by day or ``.devYYYYMMDD`` version (:mod:`harness.bisect.nightly`);
- with ``--overlay PATH``, commits of a checkout laid over the installed torch
  (:mod:`harness.bisect.commits`).

Which mode-specific flag applies to which mode is one table, :data:`FLAG_MODES`,
checked in one loop before anything runs; each mode's answer is an
:class:`~harness.bisect.answers.Answer`, printed the same way.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from harness.commands import cli
from harness.commands._options import selection_options
from harness.errors import UsageError

RELEASES, NIGHTLIES, INSIDE_DAY, OVERLAY = "releases", "nightlies", "inside-day", "overlay"
# Where each mode's flags apply; in the order their refusals are checked. INSIDE_DAY: nightlies with --pytorch-repo.
FLAG_MODES = {
    "--binary": {OVERLAY},
    "--on-path": {OVERLAY, INSIDE_DAY},
    "--strict": {OVERLAY, INSIDE_DAY},
    "--base": {OVERLAY},
    "--package": {RELEASES, NIGHTLIES},
    "--versions": {RELEASES, NIGHTLIES},
    "--builds": {RELEASES},
    "--pytorch-repo": {NIGHTLIES},
}
WHERE = {OVERLAY: "--overlay PATH", INSIDE_DAY: "nightlies with --pytorch-repo",
         NIGHTLIES: "nightlies by day (--good 2026-10-01 ...)", RELEASES: "releases, wheels or interpreters"}


def refuse_flags(modes: set, given: dict) -> None:
    """A usage error naming the first flag of ``given`` (flag -> value) that applies to none of ``modes``
    (with ``--overlay``: every such flag at once), and the fix."""
    wrong = [flag for flag, applies in FLAG_MODES.items() if given.get(flag) and not applies & modes]
    if wrong and OVERLAY in modes:
        raise UsageError(f"--overlay bisects commits of a checkout: {', '.join(wrong)} do not apply; drop them")
    if wrong:
        where = " or ".join(WHERE[m] for m in WHERE if m in FLAG_MODES[wrong[0]])
        raise UsageError(f"{wrong[0]} applies only to {where}: drop it")


@cli.command()
@click.option("--good", required=True, metavar="SPEC",
              help="A build that passes: torch==X, a .whl, /path/to/python, a nightly's day (2026-10-01) or "
                   "version (2.13.0.dev20261001); with --overlay a commit (sha, branch, tag).")
@click.option("--bad", required=True, metavar="SPEC", help="A build (or commit) that fails the selection.")
@selection_options
@click.option("--package", default=None, help="The package whose releases are bisected (default: from --good, "
              "else torch).")
@click.option("--versions", "versions", multiple=True, metavar="V[,V...]",
              help="The candidate releases, instead of asking the index (repeatable or comma-separated).")
@click.option("--builds", "builds_file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="A file of SPECs in order, one a line; --good and --bad must be in it.")
@click.option("--find-links", multiple=True, metavar="DIR|URL", help="Passed to pip (repeatable).")
@click.option("--index-url", default=None, help="Passed to pip.")
@click.option("--extra-index-url", "extra_index_urls", multiple=True, help="Passed to pip (repeatable).")
@click.option("--no-index", is_flag=True, help="Passed to pip: only --find-links.")
@click.option("--pre", is_flag=True, help="Consider pre-releases (nightlies always are).")
@click.option("--inherit/--no-inherit", default=None,
              help="Environments see this interpreter's packages (torch, the harness) behind their own. "
                   "Default: off when bisecting torch, on for any other package.")
@click.option("--installer", type=click.Choice(["auto", "pip", "uv"]), default="auto", show_default=True,
              help="What installs builds into their environments: uv (one cache of unpacked wheels, linked into "
                   "each environment), pip, or auto: uv when it is on PATH.")
@click.option("--pytorch-repo", type=click.Path(file_okay=False, exists=True), default=None,
              help="Nightlies: a local pytorch clone with the nightly branch; the result gives the main commits "
                   "between the last good and first bad nightly, those touching SyncBN's files, a compare link, "
                   "and (for torch) bisects those commits as overlays on the two nightlies.")
@click.option("--overlay", "overlay", type=click.Path(file_okay=False, exists=True), default=None, metavar="PATH",
              help="Bisect commits of this pytorch checkout: each is the installed torch with the commit's "
                   "torch/**/*.py laid over it (a cached tree per commit; the environment is not touched).")
@click.option("--base", default=None, metavar="REV",
              help="With --overlay: the checkout's commit the installed torch was built from (default: its "
                   "torch.version.git_version; needed when the checkout does not hold that commit).")
@click.option("--binary", "binaries", multiple=True, metavar="PYTHON=REV",
              help="With --overlay: lay commits over this interpreter's torch, built from the checkout's commit REV "
                   "(repeatable: each commit lies over the binary with the smaller compiled diff; the first is the "
                   "good end's). Default: this interpreter's torch and --base.")
@click.option("--on-path", "on_path", multiple=True, metavar="GLOB",
              help="With --overlay: a compiled file matching GLOB is on SyncBN's path (repeatable; replaces the "
                   "built-in set; case-insensitive, * crosses folders). A commit whose compiled diff from the "
                   "binary touches the path is skipped; one whose diff is off the path is tested, approximately.")
@click.option("--strict", is_flag=True,
              help="With --overlay: every commit whose compiled sources differ from the binary's is skipped, and "
                   "no Python-or-compiled question is asked first.")
@click.option("--store", "store_dir", type=click.Path(file_okay=False), default=None,
              help="Keep every tested build's records in this store (one file per torch build: version and "
                   "commit), for report and diff; releases of another package share torch's file. Default: a store "
                   "per build under the cache.")
@click.option("--rerun", is_flag=True, help="Ignore cached verdicts (environments are still reused).")
@click.option("--build-timeout", "eval_timeout", type=click.FloatRange(min=1), default=3600.0,
              help="Seconds for one build's run of the selection before it counts as untestable.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
def bisect(good, bad, selection, package, versions, builds_file, find_links, index_url, extra_index_urls, no_index,
           pre, inherit, installer, pytorch_repo, overlay, base, binaries, on_path, strict, store_dir, rerun,
           eval_timeout, fmt):
    """Bisect builds (releases, wheels, interpreters, nightlies by day, or overlaid commits) for the first that
    fails the selection.

    Exit 0 when the first bad build is found, 1 when an end is wrong (good not good, bad not bad).
    """
    from harness.bisect.answers import Answer
    from harness.bisect.bisector import Outcome
    from harness.bisect.builds import IndexOptions
    from harness.bisect.nightly import is_nightly_spec

    index = IndexOptions(tuple(find_links), index_url, tuple(extra_index_urls), no_index, pre)
    versions = [v for vs in versions for v in vs.split(",") if v.strip()]
    common = dict(selection=selection, rerun=rerun, eval_timeout=eval_timeout,
                  store=Path(store_dir).absolute() if store_dir else None, log=lambda s: click.echo(s, err=True))
    nightly = is_nightly_spec(good) or is_nightly_spec(bad)
    if nightly and not overlay and not (is_nightly_spec(good) and is_nightly_spec(bad)):
        raise UsageError(f"--good {good!r} and --bad {bad!r}: bisecting nightlies needs both ends as days "
                         "(2026-10-01) or nightly versions (2.13.0.dev20261001)")
    modes = ({OVERLAY} if overlay else {NIGHTLIES, INSIDE_DAY} if nightly and pytorch_repo
             else {NIGHTLIES} if nightly else {RELEASES})
    refuse_flags(modes, {"--binary": binaries, "--on-path": on_path, "--strict": strict, "--base": base,
                         "--package": package, "--versions": versions, "--builds": builds_file,
                         "--pytorch-repo": pytorch_repo})
    result: Answer
    if overlay:
        from harness.bisect.commits import bisect_commits

        result = bisect_commits(checkout=overlay, good=good, bad=bad, base=base, binaries=binaries, strict=strict,
                                on_path=on_path, **common)
    elif nightly:
        from harness.bisect.nightly import bisect_nightlies

        result = bisect_nightlies(good=good, bad=bad, package=package, versions=versions, index=index,
                                  inherit=inherit, pytorch_repo=pytorch_repo, strict=strict, on_path=on_path,
                                  installer=installer, **common)
    else:
        from harness.bisect.driver import bisect_builds

        result = bisect_builds(good=good, bad=bad, package=package, versions=versions, builds_file=builds_file,
                               index=index, inherit=inherit, installer=installer, **common)
    text = result.summary()
    if fmt == "json":
        click.echo(text, err=True)
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        click.echo(text)
    sys.exit(1 if result.outcome in (Outcome.GOOD_END_NOT_GOOD, Outcome.BAD_END_NOT_BAD) else 0)
