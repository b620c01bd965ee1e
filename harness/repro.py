"""``repro``: one standalone Python file that reproduces one (case, implementation).

The file is made from the harness's own source text, so it can never drift
from what the harness checks: every top-level statement of
:mod:`harness.case` (inputs regenerated from the seed), :mod:`harness.oracle`
(the float64 truth) and :mod:`harness.compare` (the tolerances), and the
rank-side driver of :mod:`harness.worker` (``run_task``, ``judge_sums``,
``RankContext`` and every top-level name they use, transitively), copied with ``ast`` line ranges and stripped
of their ``harness`` imports. ``from harness import compare`` becomes
``compare = sys.modules[__name__]``, since the copied names live in the file
itself. Only the launcher and the implementation loader are written here
(:data:`TEMPLATE`).

The implementation is loaded as the harness loads it:
- ``MODULE:ATTR`` plugins (and named entry points, by their target) are
  imported by name; the folder the module was found in at generation time is
  a fallback on ``sys.path``;
- ``torch``: ``torch.nn.SyncBatchNorm``. It refuses CPU input, and the
  harness's CPU mode registers its own C++ kernels in the ranks, which a
  standalone file cannot do, so the file targets CUDA (nccl) by default and
  ``--device cpu`` is refused;
- ``apex``: ``apex.parallel.SyncBatchNorm``;
- ``reference``: the harness's own SyncBN needs the harness's kernels, so that
  file imports ``harness.reference`` (said so in its header): the one case
  where it is not standalone.

The file runs as ``python FILE`` (it spawns one process per rank, joins them
over a ``TCPStore`` on a port the OS picks, gloo on CPU or nccl on CUDA, every
wait bounded) or under ``torchrun --nproc-per-node=N FILE``. It exits 0 when
every tensor agrees with the oracle, 1 and prints the disagreement when not,
2 when it cannot run here (no GPU, wrong world size).
"""

from __future__ import annotations

import ast
import datetime
import importlib.util
import inspect
import json
import shlex
from pathlib import Path
from typing import Optional

from harness.case import Case
from harness.errors import UsageError

# What the file copies: whole modules, then the named parts of the worker.
WHOLE_MODULES = ("harness.case", "harness.oracle", "harness.compare")
WORKER_PARTS = ("RankContext", "run_task", "judge_sums")  # and what they use, found by ast
INLINED = {"case", "oracle", "compare", "worker"}


def _defined(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return set()


def _closure(nodes: list[ast.stmt], roots: tuple[str, ...]) -> set[int]:
    """Indices of ``nodes`` that ``roots`` need: the roots and every top-level name they use, transitively."""
    wanted, keep = set(roots), set()
    changed = True
    while changed:
        changed = False
        for i, node in enumerate(nodes):
            if i in keep or not (_defined(node) & wanted):
                continue
            keep.add(i)
            wanted |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            changed = True
    return keep


def _segments(module_name: str, only: Optional[tuple[str, ...]] = None) -> tuple[list[str], list[str]]:
    """(imports, code blocks) of a harness module, without its docstring and harness imports.

    ``only``: keep just these top-level names and what they use (transitively).
    """
    import importlib

    mod = importlib.import_module(module_name)
    src = inspect.getsource(mod)
    lines = src.splitlines()
    tree = ast.parse(src)
    keep = _closure(tree.body, only) if only is not None else None
    imports, blocks = [], []
    for i, node in enumerate(tree.body):
        if i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the module docstring
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names]
            base = node.module if isinstance(node, ast.ImportFrom) else names[0]
            if base.split(".")[0] == "harness":
                if isinstance(node, ast.ImportFrom) and node.module == "harness":
                    for a in node.names:
                        if a.name in INLINED:  # `from harness import compare`: the names are in this file
                            imports.append(f"{a.asname or a.name} = sys.modules[__name__]")
                continue
            imports.append(ast.get_source_segment(src, node))
            continue
        if keep is not None and i not in keep:
            continue
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        blocks.append("\n".join(lines[start - 1:node.end_lineno]))
    return imports, blocks


def harness_source() -> str:
    """The copied harness code: imports first (deduplicated), then every block, in dependency order."""
    imports: list[str] = []
    blocks: list[str] = []
    parts = [(m, None) for m in WHOLE_MODULES] + [("harness.worker", WORKER_PARTS)]
    for module_name, only in parts:
        imp, blk = _segments(module_name, only)
        path = module_name.replace(".", "/") + ".py"
        what = f"{path}, verbatim" if only is None else f"{path}: {', '.join(only)} and what they use, verbatim"
        blocks.append(f"# ---- {what} " + "-" * max(0, 70 - len(what)))
        blocks += blk
        for line in imp:
            if line not in imports:
                imports.append(line)
    aliases = [i for i in imports if i.endswith("= sys.modules[__name__]")]
    plain = [i for i in imports if i not in aliases]
    code = "\n".join(plain) + "\n\n" + "\n\n\n".join(blocks) + "\n\n\n" + "\n".join(aliases) + "\n"
    _check_unique_names(code)
    return code


def _check_unique_names(code: str) -> None:
    seen: set[str] = set()
    for node in ast.parse(code).body:
        names = [node.name] if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else []
        for n in names:
            if n in seen:
                raise RuntimeError(f"repro: two harness modules define {n!r}; the standalone file needs one name")
            seen.add(n)


LOADERS = {
    "plugin": '''
def load_factory():
    """The plugin class or factory, imported by name (as the harness does)."""
    import importlib
    try:
        mod = importlib.import_module(PLUGIN_MODULE)
    except ImportError:
        if not (FOUND_IN and os.path.isdir(FOUND_IN)):
            raise
        print(f"repro: {PLUGIN_MODULE} is not importable; using {FOUND_IN} (where it was found)", file=sys.stderr)
        sys.path.insert(0, FOUND_IN)
        mod = importlib.import_module(PLUGIN_MODULE)
    return getattr(mod, PLUGIN_ATTR)


def convert(model, process_group):
    """The plugin's convert_sync_batchnorm, as the harness calls it (nested-model cases)."""
    return load_factory().convert_sync_batchnorm(model, process_group)
''',
    "torch": '''
def load_factory():
    """torch.nn.SyncBatchNorm, exactly as shipped."""
    return torch.nn.SyncBatchNorm


def convert(model, process_group):
    return torch.nn.SyncBatchNorm.convert_sync_batchnorm(model, process_group)
''',
    "apex": '''
def load_factory():
    """apex.parallel.SyncBatchNorm (channel_last with the optimized extension and channels_last input)."""
    import functools
    from apex.parallel import SyncBatchNorm
    if CASE.memory_format == "channels_last" and importlib.util.find_spec("syncbn") is not None:
        return functools.partial(SyncBatchNorm, channel_last=True)
    return SyncBatchNorm


def convert(model, process_group):
    from apex.parallel import convert_syncbn_model
    return convert_syncbn_model(model, process_group=process_group)
''',
    "reference": '''
def load_factory():
    """The harness's reference SyncBN: NOT standalone, it needs the harness and its C++ kernels."""
    from harness import extension
    from harness.reference import SyncBatchNorm
    extension.load()
    return SyncBatchNorm


def convert(model, process_group):
    return load_factory().convert_sync_batchnorm(model, process_group)
''',
}

TEMPLATE = '''#!/usr/bin/env python3
{header}
"""Standalone reproduction of {case_id} for {impl_name}; run: python {filename} (or under torchrun)."""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
import time

{harness_code}

# ---- the reproduction -------------------------------------------------------------
CASE = Case.from_dict(json.loads({case_json!r}))
IMPL_NAME = {impl_name!r}
DEVICE = {device!r}
BACKEND = {backend!r}
TIMEOUT_S = {timeout!r}  # the whole case, every rank; then the ranks are killed and it is a hang
PLUGIN_MODULE = {plugin_module!r}
PLUGIN_ATTR = {plugin_attr!r}
FOUND_IN = {found_in!r}
{loader}

class ReproImpl:
    """The implementation under test, with the adapter shape the copied driver expects."""

    name = IMPL_NAME
    mode = "native"

    def version(self):
        mod = sys.modules.get(PLUGIN_MODULE) if PLUGIN_MODULE else None
        return getattr(mod, "__version__", None) if mod else torch.__version__

    def build(self, case, process_group, device):
        factory = load_factory()
        return factory(case.channels, eps=case.eps, momentum=case.momentum, affine=case.affine,
                       track_running_stats=case.track_running_stats, process_group=process_group)

    def convert(self, model, process_group):
        return convert(model, process_group)

    def forward(self, module, input):
        return module(input)


class ReproContext(RankContext):
    def impl(self, key, device):
        return ReproImpl()


def one_rank(rank, world_size):
    if DEVICE == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    task = {{"case": CASE.to_dict(), "impl": IMPL_NAME, "device": DEVICE}}
    return run_task(ReproContext(rank, world_size), task)


def _rank_entry(rank, world_size, port, outdir):
    import datetime
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=TIMEOUT_S)
    store = dist.TCPStore("127.0.0.1", port, world_size + 1, False, timeout=timeout)
    dist.init_process_group(BACKEND, store=store, rank=rank, world_size=world_size, timeout=timeout)
    try:
        result = one_rank(rank, world_size)
    finally:
        dist.destroy_process_group()
    with open(os.path.join(outdir, f"rank{{rank}}.json"), "w") as f:
        json.dump(result, f)


def spawn_ranks():
    """One process per rank (spawn), a TCPStore on a port the OS picks; every wait bounded."""
    import datetime
    import multiprocessing as mp
    import torch.distributed as dist

    ws = CASE.world_size
    timeout = datetime.timedelta(seconds=TIMEOUT_S)
    try:
        store = dist.TCPStore("127.0.0.1", 0, ws + 1, True, wait_for_workers=False, timeout=timeout)
    except TypeError:  # releases without wait_for_workers
        store = dist.TCPStore("127.0.0.1", 0, ws + 1, True, timeout=timeout)
    outdir = tempfile.mkdtemp(prefix="syncbn-repro-")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_entry, args=(r, ws, store.port, outdir), daemon=True) for r in range(ws)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + TIMEOUT_S + 60
    problems = []
    for r, p in enumerate(procs):
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            problems.append(f"rank {{r}}: hang (still running after {{TIMEOUT_S}}s)")
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join(10)
    results = []
    for r, p in enumerate(procs):
        path = os.path.join(outdir, f"rank{{r}}.json")
        if os.path.exists(path):
            with open(path) as f:
                results.append(json.load(f))
        elif not any(s.startswith(f"rank {{r}}:") for s in problems):
            problems.append(f"rank {{r}}: crash (exit code {{p.exitcode}}, no result)")
    return results, problems


def under_torchrun():
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def torchrun_rank():
    import torch.distributed as dist

    ws = int(os.environ["WORLD_SIZE"])
    if ws != CASE.world_size:
        print(f"repro: this case needs {{CASE.world_size}} ranks, torchrun started {{ws}}: "
              f"use --nproc-per-node={{CASE.world_size}}", file=sys.stderr)
        sys.exit(2)
    if DEVICE == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    import datetime

    dist.init_process_group(BACKEND, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    rank = dist.get_rank()
    result = run_task(ReproContext(rank, ws), {{"case": CASE.to_dict(), "impl": IMPL_NAME, "device": DEVICE}})
    everyone = [None] * ws
    dist.all_gather_object(everyone, result)
    dist.destroy_process_group()
    return everyone, rank


def verdict(results, problems, show=True):
    """Print (if ``show``) what disagrees with the oracle; 0 when nothing does, 1 otherwise."""
    lines = list(problems)
    for res in sorted(results, key=lambda r: r["rank"]):
        if res["status"] == "error":
            lines.append(f"rank {{res['rank']}}: error {{res['exception_type']}}: {{res['message']}}")
            lines.append(res.get("traceback") or "")
        for name, m in res.get("metrics", {{}}).items():
            if not m["ok"]:
                lines.append(f"rank {{res['rank']}}: {{name}}: " + (m["problem"] or
                             f"max abs err {{m['max_abs_err']}} > tol {{m['tol']}} ({{m['ratio']}}x the tolerance), "
                             f"max rel err {{m['max_rel_err']}}"))
    if len(results) == CASE.world_size and CASE.affine and all(r["status"] in ("pass", "mismatch") for r in results):
        _, sum_problems = judge_sums(results)
        lines += sum_problems
    build = f"torch {{torch.__version__}} (git {{torch.version.git_version}}), {{DEVICE}}/{{BACKEND}}"
    if not show:
        return 1 if lines else 0
    if lines:
        print(f"FAIL: {{IMPL_NAME}} disagrees with the float64 oracle on {{CASE.id}} ({{build}}):")
        for line in lines:
            print("  " + line)
        return 1
    print(f"PASS: {{IMPL_NAME}} agrees with the float64 oracle on {{CASE.id}} ({{build}})")
    return 0


def main():
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("repro: this reproduction runs on CUDA and no GPU is visible here", file=sys.stderr)
        return 2
    if DEVICE == "cuda" and torch.cuda.device_count() < CASE.world_size and not under_torchrun():
        print(f"repro: {{CASE.world_size}} ranks need {{CASE.world_size}} GPUs, {{torch.cuda.device_count()}} visible; "
              "nccl cannot share one GPU between ranks", file=sys.stderr)
        return 2
    if under_torchrun():
        results, rank = torchrun_rank()
        return verdict(results, [], show=rank == 0)  # every rank exits with the verdict; rank 0 prints it
    results, problems = spawn_ranks()
    return verdict(results, problems)


if __name__ == "__main__":
    sys.exit(main())
'''


def _plugin_location(module: str) -> Optional[str]:
    """The folder to put on ``sys.path`` for ``module`` (where it was found now), or None."""
    top = module.split(".")[0]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or spec.origin in ("built-in", "frozen"):
        return None
    origin = Path(spec.origin)
    return str(origin.parent.parent if spec.submodule_search_locations else origin.parent)


def resolve_impl(name: str) -> dict:
    """How the file loads ``name``: kind and, for plugins, module, attribute and where it was found."""
    from harness.impls import _entry_points, builtin_names

    if name in builtin_names():
        if name not in LOADERS:
            raise UsageError(f"repro does not know how to load built-in {name!r}: choose torch, apex, reference "
                             "or MODULE:ATTR")
        return {"kind": name, "module": None, "attr": None, "found_in": None}
    target = _entry_points()[name].value if name in _entry_points() else name
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        from harness.impls import known_names

        raise UsageError(f"unknown impl {name!r}: choose one of {', '.join(known_names())}, or MODULE:ATTR")
    return {"kind": "plugin", "module": module, "attr": attr, "found_in": _plugin_location(module)}


def find_case(case_id: str) -> Case:
    """The one case ``case_id`` names (an ID, or a pattern matching exactly one ID)."""
    from harness import catalog

    matches = catalog.select([case_id], exhaustive=True)
    exact = [c for c in matches if c.id == case_id]
    if exact:
        return exact[0]
    if len(matches) != 1:
        shown = ", ".join(c.id for c in matches[:5]) + (" ..." if len(matches) > 5 else "")
        raise UsageError(f"case {case_id!r} matches {len(matches)} cases ({shown}): give one case ID")
    return matches[0]


def observe(case: Case, impl_name: str, device: str, timeout: float = 300.0):
    """Run the case once with the harness and return its record (what the header reports)."""
    from harness import runner

    impls = runner.resolve_impls([impl_name])
    opts = runner.RunOptions(device=device, timeout=timeout)
    return next(iter(runner.run_selection([case], impls, opts)))


def header(case: Case, impl_name: str, device: str, impl: dict, record, command: str) -> str:
    """The comment block: what was observed, on which build, and the command that found it."""
    from harness import __version__
    from harness.buildinfo import build_info

    info = build_info()
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    sel = f"--impl {shlex.quote(impl_name)} --case {shlex.quote(case.id)}"
    out = [f"Reproduction of SyncBatchNorm case {case.id} for {impl_name}.",
           f"Written by syncbn-harness {__version__} on {now} ({command}).", ""]
    if record is not None:
        mode = f", mode {record.mode}" if record.mode else ""
        out += [f"Observed: {record.status.value}" + (f": {record.message}" if record.message else ""),
                f"  on torch {record.torch_version} (git {record.torch_git_version}), CUDA {record.cuda_version}, "
                f"device {record.device}, backend {record.backend}{mode}, {impl_name} {record.impl_version or ''}",
                f"  host {record.host}, {record.started_at}.",
                f"Found with: syncbn-harness check {sel} --device {record.device}"]
    else:
        out += [f"Not run before writing; the harness build here: torch {info.torch_version} "
                f"(git {info.torch_git_version}).", f"Check with: syncbn-harness check {sel}"]
    out += ["", f"Case parameters: {json.dumps(case.params())}",
            "Inputs are regenerated from the seed; the oracle is batch normalization over the global batch in",
            "float64; tolerances are the harness's (dtype unit roundoff, reduction size; see compare below).",
            f"Runs on {device} ({'nccl' if device == 'cuda' else 'gloo'}): python FILE, or "
            f"torchrun --nproc-per-node={case.world_size} FILE.",
            "Exit 0: agrees with the oracle. Exit 1: the disagreement is printed. Exit 2: cannot run here."]
    if impl["kind"] == "torch":
        out += ["NOTE: the harness observed this on CPU in its cpu-emulation mode (torch's SyncBatchNorm module and",
                "autograd Function over the harness's CPU kernels for the five batch_norm_* ops, registered in its",
                "rank processes). A standalone file cannot register those kernels, so this file runs torch's",
                "SyncBatchNorm on CUDA with nccl, where a defect in torch's Python code reproduces as it is;",
                "a difference in the kernels' arithmetic would be the harness's."]
    if impl["kind"] == "reference":
        out += ["NOTE: NOT standalone: the reference SyncBN needs the harness (harness.reference) and its C++",
                "kernels (built on first use); install syncbn-harness to run it."]
    if impl["kind"] == "plugin":
        out += [f"The implementation is imported by name: {impl['module']}:{impl['attr']} (found in "
                f"{impl['found_in']} when written; that folder is a fallback on sys.path)."]
    return "\n".join("# " + ln if ln else "#" for ln in out)


def repro_source(case: Case, impl_name: str, *, device: str, record=None, command: str = "",
                 filename: str = "repro.py", timeout: float = 300.0) -> str:
    """The text of the standalone file (see the module docstring)."""
    impl = resolve_impl(impl_name)
    text = TEMPLATE.format(
        header=header(case, impl_name, device, impl, record, command), case_id=case.id, impl_name=impl_name,
        filename=filename, harness_code=harness_source(), case_json=json.dumps(case.to_dict()), device=device,
        backend="nccl" if device == "cuda" else "gloo", timeout=timeout, plugin_module=impl["module"],
        plugin_attr=impl["attr"], found_in=impl["found_in"], loader=LOADERS[impl["kind"]])
    compile(text, filename, "exec")
    return text


def write_repro(case_id: str, impl_name: str, *, output: Optional[str] = None, device: Optional[str] = None,
                run_first: bool = True, timeout: float = 300.0, command: str = "") -> tuple[Path, object]:
    """Write the repro of ``case_id`` for ``impl_name``; return its path and the observed record (or None)."""
    case = find_case(case_id)
    impl = resolve_impl(impl_name)
    if impl["kind"] == "torch" and device == "cpu":
        raise UsageError("--impl torch --device cpu cannot be standalone: torch.nn.SyncBatchNorm refuses CPU "
                         "input and the harness's cpu-emulation registers its own C++ kernels; use --device cuda "
                         "(the default for torch)")
    from harness.cli import _default_device

    file_device = device or ("cuda" if impl["kind"] == "torch" else _default_device())
    record = None
    if run_first:
        record = observe(case, impl_name, _default_device() if impl["kind"] == "torch" else file_device, timeout)
    safe = case.id.replace("/", "_")
    path = Path(output or f"repro_{safe}_{impl_name.replace(':', '_').replace('.', '_')}.py").expanduser()
    text = repro_source(case, impl_name, device=file_device, record=record, command=command, filename=path.name,
                        timeout=timeout)
    path.write_text(text)
    path.chmod(0o755)
    return path, record
