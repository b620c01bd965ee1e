"""A search's findings as files: a Markdown and a JSON summary, and one repro file per finding.

Layout of the output folder (``--out``, default ``reports/search``), rewritten
by each search::

    findings.md     what was searched, the rate, and per finding (one per cause): the cause and its
                    condition, its symptoms, minimal and original case, cases to first failure, runs to
                    shrink, the repro command and file
    findings.json   the same as data (SearchResult.to_dict)
    repro-<n>.py    the standalone reproduction of finding n's minimal case (new findings only)
    repro-<n>-cpu-demo.py  for torch's layer searched on CPU: the same over CPU stand-ins for torch's CUDA
                    ops, labelled a demonstration (repro-<n>.py, the evidence, needs a GPU)

The repro files are written from the minimal case's parameters (it need not
be in the catalog) in the short, issue-ready form, and run once: the finding
says whether its file shows the symptom on its own, or needs a GPU (torch's
layer: then the CPU demonstration's outcome is said beside it). A minimal case the short
form cannot state gets the long form, with the reason. ``syncbn-harness repro
<ID>`` writes the same file once the case is promoted (``search --save``).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Optional

from harness.results.severity import Assessment, Severity, assess, reach
from harness.search.explore import SearchResult
from harness.search.space import size_of


def assess_finding(f) -> Optional[Assessment]:
    """The minimal case's assessment, its reach widened by the case it was first seen in: a finding reaches
    every configuration either shows it in, and needs only what both need."""
    a = assess(f.record)
    if a is None:
        return None
    tags, common, rare = reach(f.original.params())
    return replace(a, reach=tuple(dict.fromkeys(a.reach + tags)), common=a.common or common,
                   rare=tuple(r for r in a.rare if r in rare))


def order_by_severity(result: SearchResult) -> None:
    """New findings first, then known ones; each worst first (:mod:`harness.results.severity`), then as found."""
    def key(f):
        a = assess_finding(f)
        return (f.known, a.rank if a else len(Severity), not (a and a.common))

    result.findings.sort(key=key)


def write_repros(result: SearchResult, out: Path, device: str, command: str) -> None:
    """One standalone file per new finding, named in the finding (``repro_file``, ``repro_verdict``)."""
    from harness.errors import UsageError
    from harness.repro import write_short
    from harness.repro.long import repro_source, resolve_impl

    out.mkdir(parents=True, exist_ok=True)
    for n, f in enumerate(result.findings, 1):
        if f.known:
            continue
        path = out / f"repro-{n}.py"
        try:
            f.repro_verdict = write_short(f.minimal, f.impl, f.record, path, title=f.title).verdict()
            if device == "cpu" and f.repro_verdict.startswith("needs a GPU"):  # torch's layer
                demo = out / f"repro-{n}-cpu-demo.py"
                shown = write_short(f.minimal, f.impl, f.record, demo, title=f.title, cpu_demo=True).verdict()
                f.repro_verdict += f"; its CPU demonstration over stand-ins, {demo.name}: {shown}"
        except UsageError as exc:  # the short form cannot state it: the generated form, with why
            try:
                loading = resolve_impl(f.impl)
                path.write_text(repro_source(f.minimal, f.impl, device=loading.file_device(None, device),
                                             record=f.record, command=command, filename=path.name, loading=loading))
            except UsageError as no_long:  # neither form: the finding says why, the summary is still written
                f.repro_verdict = f"no repro file ({exc}; the long form: {no_long})"
                continue
            path.chmod(0o755)
            f.repro_verdict = f"long form ({exc})"
        f.repro_file = str(path)


def symptoms_text(f) -> str:
    """A finding's symptoms, most seen first: ``train.output (5 cases), train.running_mean (2)``."""
    ranked = sorted(f.symptoms.items(), key=lambda kv: -kv[1])
    words = [sig.split(": ", 1)[-1] for sig, _ in ranked]  # the implementation is the finding's
    return ", ".join(f"{w} ({n} case{'s' if n != 1 else ''})" if i == 0 else f"{w} ({n})"
                     for i, (w, (_, n)) in enumerate(zip(words, ranked)))


def _size(d: dict) -> str:
    return (f"{d['world_size']} ranks, {d['steps']} steps, {d['channels']} channels, {d['ndim']}-D, "
            f"{d['max_count_per_rank']:,} values per channel on a rank")


def markdown(result: SearchResult, build: str) -> str:
    """The findings summary as Markdown."""
    lines = [f"# Search findings ({build})", "",
             f"Seed {result.seed}; implementations {', '.join(result.impls)}; {result.cases_explored} cases explored "
             f"in {result.explore_s:.0f} s ({result.rate:.2f} cases/s), {result.runs} runs in all with shrinking, "
             f"{result.elapsed_s:.0f} s; stopped by {result.stopped_by}.", "",
             "Statuses of explored runs: " + ", ".join(f"{k} {v}" for k, v in sorted(result.statuses.items())), ""]
    new, known = result.new, [f for f in result.findings if f.known]
    lines.append(f"{len(new)} new finding(s), one per cause, {len(known)} known issue(s); each group worst first.")
    for n, f in enumerate(result.findings, 1):
        lines += ["", f"## {n}. {f.signature} (known)" if f.known else f"## {n}. {f.title}", ""]
        if not f.known:
            lines.append(f"- symptoms (explored cases that showed each): {symptoms_text(f)}")
        if f.link:
            lines.append(f"- upstream: {f.link}")
        a = assess_finding(f)
        if a:
            lines += [f"- severity: {a.summary()}", f"- in training: {a.notice()}"]
        if f.record.emulated:
            lines.append("- seen in cpu-emulation, not yet confirmed on CUDA")
        lines += [f"- minimal case: `{f.minimal.id}` ({_size(size_of(f.minimal))})",
                  f"- message: {f.record.message.splitlines()[0][:300] if f.record.message else ''}",
                  f"- first seen after {f.found_after} cases ({f.found_at_s:.1f} s), in `{f.original.id}` "
                  f"({_size(size_of(f.original))}); failed this way in {f.occurrences} explored case(s)"]
        if not f.known:
            lines.append(f"- shrunk in {f.shrink_runs} runs")
            if f.repro_file:
                lines.append(f"- repro file: `{f.repro_file}`: {f.repro_verdict}")
            lines.append(f"- after `search --save`: `syncbn-harness repro {shlex.quote(f.minimal.id)} --impl "
                         f"{shlex.quote(f.impl)}`")
        lines.append(f"- parameters: `{json.dumps(f.minimal.params())}`")
    return "\n".join(lines) + "\n"


def write_summary(result: SearchResult, out: Path, build: str) -> tuple[Path, Path]:
    """``findings.md`` and ``findings.json`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    md, js = out / "findings.md", out / "findings.json"
    md.write_text(markdown(result, build))
    js.write_text(json.dumps({"build": build, **result.to_dict()}, indent=2) + "\n")
    return md, js
