"""A GPU run's raw files kept in the repository, and the pages that cite them checked against them.

Filing (:func:`file_run`): what a lent machine sent back from ``gpu-suite``
(the packed folder) is copied into ``docs/gpu-runs/<date>-<gpu>/``: the small
files as they came (:data:`~harness.gpu_suite.pack.COPIED`, ``console.txt``),
the raw files that only the tarball holds (:data:`FROM_TARBALL`: the fidelity
table, the Nsight Compute profile, the repro verdicts and their logs, the
NCCL probe), and ``calls.md``, the exact command of each call to the machine.
The tarball itself (the whole store, every log) is not kept: ``records.csv``
holds each record's case, implementation, status and error over tolerance.

Recording (:func:`record_repro_runs`): the repro files' verdicts of a filed
run become runs of record in ``docs/findings/runs.toml`` (each file's sha256
as it ran, the exit status, the verdict line, its log in the filed run), which
the claims "exits N on CUDA" in the findings docs are checked against.

Citing: a page embeds a table of a filed run between two markers::

    <!-- table: docs/gpu-runs/2026-11-28-h200 bench -->
    ...the table...
    <!-- end table -->

:func:`check_page` renders every such table again from the run's files
(:mod:`harness.gpu_suite.tables`) and lists each one that differs, so a
figure on the page is always the figure in the raw files; :func:`refresh_page`
rewrites them.
"""

from __future__ import annotations

import json
import re
import shutil
import tarfile
from pathlib import Path

from harness.errors import UsageError
from harness.gpu_suite import tables
from harness.gpu_suite.pack import COPIED
from harness.gpu_suite.repros import ABSENT, CANNOT, SHOWS

FROM_TARBALL = ("fidelity.md", "ncu.md", "ncu.csv", "repros.json", "nccl-probe.json")
REPRO_LOGS = "logs/repros/"
BLOCK = re.compile(r"(<!-- table: (?P<run>\S+) (?P<section>\S+) -->\n)(?P<body>.*?)\n?(<!-- end table -->)", re.S)
OPENING = "<!-- table:"


def file_run(packed: Path, into: Path, calls: list[str]) -> list[Path]:
    """Copy a packed GPU run into ``into`` (see the module docstring); the files written.

    Refuses a folder that is not a packed run, and one that already holds a filed run (nothing is overwritten).
    """
    if not (packed / "steps.json").is_file():
        raise UsageError(f"{packed}: not a packed GPU run (no steps.json); give the folder gpu-suite --out wrote")
    if into.exists() and any(into.iterdir()):
        raise UsageError(f"{into} already holds files: file each run into a folder of its own "
                         "(docs/gpu-runs/<date>-<gpu>)")
    into.mkdir(parents=True, exist_ok=True)
    written = []
    for name in (*COPIED, "console.txt"):
        if (packed / name).is_file():
            shutil.copyfile(packed / name, into / name)
            written.append(into / name)
    tarball = packed / "suite.tar.gz"
    if tarball.is_file():
        with tarfile.open(tarball) as tar:
            for member in tar.getmembers():
                rel = member.name.split("/", 1)[1] if "/" in member.name else ""
                if not member.isfile():
                    continue
                if rel in FROM_TARBALL:
                    dest = into / rel
                elif rel.startswith(REPRO_LOGS):
                    dest = into / "repro-logs" / Path(rel).name
                else:
                    continue
                dest.parent.mkdir(parents=True, exist_ok=True)
                with tar.extractfile(member) as src, open(dest, "wb") as out:
                    shutil.copyfileobj(src, out)
                written.append(dest)
    lines = ["# The calls of this run", "",
             "Each command as it was given to the lent machine (the working tree of the harness commit in "
             "machine.json, run from its root; `$OUT` is the folder whose files came back).", ""]
    for n, call in enumerate(calls, 1):
        lines += [f"{n}.", "", "```", call, "```", ""]
    (into / "calls.md").write_text("\n".join(lines), encoding="utf-8")
    written.append(into / "calls.md")
    return written


def blocks(page: str) -> list[tuple[str, str, str]]:
    """Every cited table of ``page``: (run folder, section, the table as the page has it)."""
    return [(m["run"], m["section"], m["body"]) for m in BLOCK.finditer(page)]


def check_page(page: Path, root: Path) -> list[str]:
    """Every table of ``page`` that differs from its rendering from the run's files (paths from ``root``)."""
    problems = []
    text = page.read_text(encoding="utf-8")
    found = blocks(text)
    if len(found) != text.count(OPENING):
        problems.append(f"{page.name}: {text.count(OPENING)} tables open but {len(found)} are well formed "
                        f"(`{OPENING} RUN SECTION -->`, the table, `<!-- end table -->`)")
    for run, section, body in found:
        folder = root / run
        if not folder.is_dir():
            problems.append(f"{page.name}: table {section} cites {run}, which does not exist")
            continue
        want = tables.render(section, folder)
        if body.strip() != want.strip():
            problems.append(f"{page.name}: table {section} of {run} differs from its raw files")
    return problems


def refresh_page(page: Path, root: Path) -> int:
    """Rewrite every cited table of ``page`` from its run's files; how many changed."""
    text = page.read_text(encoding="utf-8")
    changed = 0

    def redo(m: re.Match) -> str:
        nonlocal changed
        want = tables.render(m["section"], root / m["run"]).strip()
        changed += want != m["body"].strip()
        return m.group(1) + want + "\n" + m.group(5)

    page.write_text(BLOCK.sub(redo, text), encoding="utf-8")
    return changed


def record_repro_runs(filed: Path, runs: Path, root: Path) -> int:
    """Append the repro verdicts of the run filed in ``filed`` to ``runs`` as runs of record (see the module
    docstring): each file that printed a verdict line (shows, does not show, could not run), with its log's
    path relative to ``root`` (absolute where it lies elsewhere); how many were added. A verdict without the
    file's sha256 (written before they carried one) is left out, and so is one already recorded."""
    verdicts_file, machine_file = filed / "repros.json", filed / "machine.json"
    if not verdicts_file.is_file() or not machine_file.is_file():
        return 0
    machine = json.loads(machine_file.read_text(encoding="utf-8"))
    gpus = machine.get("gpus") or []
    where = "cuda" if gpus else "cpu"
    gpu = (f"{gpus[0]['name']} (sm_{gpus[0]['capability'].replace('.', '')}), {machine.get('cpus')} cores, "
           f"driver {machine.get('driver')}") if gpus else f"{machine.get('cpus')} cores, no GPU"
    have = runs.read_text(encoding="utf-8") if runs.is_file() else ""
    date = filed.name[:10]
    added = []
    for v in json.loads(verdicts_file.read_text(encoding="utf-8")):
        if v.get("exit") not in (0, 1, 2) or not v.get("sha256") or v["verdict"] not in (SHOWS, ABSENT, CANNOT):
            continue
        if f'sha256 = "{v["sha256"]}"' in have and f'date = "{date}"' in have:
            continue
        log = (filed / "repro-logs" / f"{Path(v['file']).stem}.txt").resolve()
        if log.is_relative_to(root.resolve()):
            log = log.relative_to(root.resolve())
        fields = {"file": v["file"], "sha256": v["sha256"], "commit": (machine.get("harness") or {}).get("commit"),
                  "where": where, "machine": gpu, "build": f"torch {machine.get('torch')}", "date": date,
                  "exit": v["exit"], "line": v["line"], "log": log.as_posix()}
        added.append("\n[[run]]\n" + "".join(f"{k} = {json.dumps(val)}\n" for k, val in fields.items()
                                             if val is not None))
    if added:
        with open(runs, "a", encoding="utf-8") as out:
            out.write("".join(added))
    return len(added)
