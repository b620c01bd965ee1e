"""The long form of a repro file (``repro --long``): the harness's own code for one (case, implementation).

The file is made from the harness's own source text, so it can never drift
from what the harness checks. :data:`PARTS` lists what it copies, in order:
whole modules (the case's data, the float64 oracle, the tolerances, the
scenario's rank code) and named top-level functions and classes of others
(with every top-level name they use, found with ``ast``), then
:mod:`harness.repro.standalone` (the launcher, itself a real module), then
the file's configuration. Top-level ``harness`` imports are dropped: the
names they bring are defined in the file. Nothing is written as a template:
each line of code in a repro file is a line of an importable, tested module.

The implementation is loaded as the harness loads it:
- ``MODULE:ATTR`` plugins (and named entry points, by their target) are
  imported by name; the folder the module was found in at generation time is
  a fallback on ``sys.path``;
- ``torch``: ``torch.nn.SyncBatchNorm``. It refuses CPU input, and the
  harness's CPU mode registers its own C++ kernels in the ranks, which a
  standalone file cannot do, so the file targets CUDA (nccl) by default and
  ``--device cpu`` is refused;
- ``apex``: ``apex.parallel.SyncBatchNorm``, called through the apex adapter's
  own functions (channels-last input handed over as its NHWC view);
- ``reference``: the harness's own SyncBN needs the harness's kernels, so that
  file imports the harness (said so in its header): the one case where it is
  not standalone.
"""

from __future__ import annotations

import ast
import datetime
import enum
import importlib
import importlib.util
import inspect
import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from harness.catalog.case import Case
from harness.errors import UsageError

# (module, None: all of it | names: just these and what they use), in the order the file defines them.
PARTS = (
    ("harness.judge.metric", None),
    ("harness.judge.metric_key", None),
    ("harness.judge.call", None),
    ("harness.judge.status", None),
    ("harness.judge.mode", ("declared_mode",)),
    ("harness.slices", None),
    ("harness.catalog.dtypes", None),
    ("harness.catalog.case", None),
    ("harness.catalog.data", None),
    ("harness.judge.oracle", None),
    ("harness.judge.elementwise", None),
    ("harness.judge.budget", None),
    ("harness.judge.compare", None),
    ("harness.judge.network_budget", None),
    ("harness.engine.messages", None),
    ("harness.engine.collectives", None),
    ("harness.judge.invariants", None),
    ("harness.judge.desync", None),
    ("harness.judge.verdict", ("rank_verdict",)),
    ("harness.engine.nccl_contract", None),
    ("harness.engine.list_contract", None),
    ("harness.engine.compiled", None),
    ("harness.engine.exchange", None),
    ("harness.engine.rank", ("RankContext", "run_task")),
    ("harness.impls.base", ("construct_like_syncbn",)),
    ("harness.impls.apex", ("construct_apex", "convert_apex", "apex_forward")),
)
LAUNCHER = "harness.repro.standalone"


class Kind(str, enum.Enum):
    """How the file loads the implementation (the launcher reads its value as ``KIND``)."""

    PLUGIN = "plugin"  # MODULE:ATTR, or a named entry point's target
    TORCH = "torch"
    APEX = "apex"
    REFERENCE = "reference"


@dataclass(frozen=True)
class Loading:
    """How a long file loads ``--impl``: its kind and, for a plugin, module, attribute and where it was found."""

    kind: Kind
    module: Optional[str] = None
    attr: Optional[str] = None
    found_in: Optional[str] = None

    def file_device(self, asked: Optional[str], here: str) -> str:
        """The file's device: ``asked``, else CUDA for torch's layer (it refuses CPU input, and a standalone
        file cannot register the harness's CPU kernels), else ``here``."""
        return asked or ("cuda" if self.kind is Kind.TORCH else here)


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
                    imports += [_constant(a.name, a.asname, module_name) for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    # A harness module used by name (``networks.spec``): the file holds its code at top level.
                    for a in node.names:
                        if inspect.ismodule(getattr(importlib.import_module(node.module), a.name, None)):
                            imports += ["import sys", f"{a.asname or a.name} = sys.modules[__name__]"]
                continue
            imports.append(ast.get_source_segment(src, node))
            continue
        if keep is not None and i not in keep:
            continue
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        blocks.append("\n".join(lines[start - 1:node.end_lineno]))
    return imports, blocks


def _constant(name: str, asname: Optional[str], where: str) -> str:
    """``from harness import NAME`` in copied code: a literal NAME (a version number) is written out."""
    import harness

    value = getattr(harness, name)
    if not isinstance(value, (int, str)):
        raise RuntimeError(f"{where}: `from harness import {name}` cannot be copied into a repro file; import the "
                           "names it uses from their modules (`from harness.x.y import name`)")
    return f"{asname or name} = {value!r}"


def scenario_parts(module_name: str) -> list[tuple[str, Optional[tuple[str, ...]]]]:
    """The other scenario modules ``module_name`` uses, what it needs of each, dependencies first.

    A module it imports as a module (``from harness.scenarios import networks``) comes whole; one it
    imports names from (``from harness.scenarios.model import judge_across``) gives just those names and
    what they use, so that no two scenarios' ``run_rank`` meet in one file.
    """
    order: list[str] = []
    needs: dict[str, Optional[set]] = {}

    def visit(name: str) -> None:
        tree = ast.parse(inspect.getsource(importlib.import_module(name)))
        for node in tree.body:
            if not (isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("harness.scenarios")):
                continue
            for a in node.names:
                target = getattr(importlib.import_module(node.module), a.name)
                dep, names = (target.__name__, None) if inspect.ismodule(target) else (node.module, {a.name})
                if dep not in needs:
                    visit(dep)
                    order.append(dep)
                    needs[dep] = names
                elif needs[dep] is not None:
                    needs[dep] = None if names is None else needs[dep] | names

    visit(module_name)
    return [(m, None if needs[m] is None else tuple(sorted(needs[m]))) for m in order]


def harness_source(case: Case) -> str:
    """The copied code: imports first (deduplicated), then every part, then the launcher."""
    imports: list[str] = []
    blocks: list[str] = []
    cut = len(PARTS) - 3  # the scenario's rank code after what it uses, before the rank loop and adapters
    scenario = f"harness.scenarios.{case.scenario}"
    parts = list(PARTS[:cut]) + scenario_parts(scenario) + [(scenario, None)] + list(PARTS[cut:]) + [(LAUNCHER, None)]
    for module_name, only in parts:
        imp, blk = _segments(module_name, only)
        path = module_name.replace(".", "/") + ".py"
        what = f"{path}, verbatim" if only is None else f"{path}: {', '.join(only)} and what they use, verbatim"
        blocks.append(f"# ---- {what} " + "-" * max(0, 70 - len(what)))
        blocks += blk
        for line in imp:
            if line not in imports:
                imports.append(line)
    code = "\n".join(imports) + "\n\n\n" + "\n\n\n".join(blocks) + "\n"
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


def resolve_impl(name: str) -> Loading:
    """How the file loads ``name`` (see :class:`Loading`)."""
    from harness.impls import builtin_names, known_names
    from harness.impls.registry import entry_points

    if name in builtin_names():
        builtins = [k.value for k in Kind if k is not Kind.PLUGIN]
        if name not in builtins:
            raise UsageError(f"repro does not know how to load built-in {name!r}: choose one of "
                             f"{', '.join(builtins)}, or MODULE:ATTR")
        return Loading(Kind(name))
    eps = entry_points()
    target = eps[name].value if name in eps else name
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        raise UsageError(f"unknown impl {name!r}: choose one of {', '.join(known_names())}, or MODULE:ATTR")
    return Loading(Kind.PLUGIN, module, attr, _plugin_location(module))


def header(case: Case, impl_name: str, device: str, impl: Loading, record, command: str) -> str:
    """The comment block: what was observed, on which build, and the command that found it."""
    from harness import __version__
    from harness.buildinfo import build_info

    info = build_info()
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    sel = f"--impl {shlex.quote(impl_name)} --case {shlex.quote(case.id)}"
    out = [f"Reproduction of SyncBatchNorm case {case.id} for {impl_name}.",
           f"Written by syncbn-harness {__version__} on {now} ({command}).", ""]
    if record is not None:
        mode = f", mode {record.mode_text}" if record.mode_text else ""
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
            "float64; tolerances are the harness's (dtype unit roundoff, reduction size; see budget below).",
            f"Runs on {device} ({'nccl' if device == 'cuda' else (case.backend or 'gloo')}): python FILE, or "
            f"torchrun --nproc-per-node={case.world_size} FILE.",
            "Exit 0: agrees with the oracle. Exit 1: the disagreement is printed. Exit 2: cannot run here."]
    if impl.kind is Kind.TORCH:
        out += ["NOTE: the harness observed this on CPU in its cpu-emulation mode (torch's SyncBatchNorm module and",
                "autograd Function over the harness's CPU kernels for the five batch_norm_* ops, registered in its",
                "rank processes). A standalone file cannot register those kernels, so this file runs torch's",
                "SyncBatchNorm on CUDA with nccl, where a defect in torch's Python code reproduces as it is;",
                "a difference in the kernels' arithmetic would be the harness's."]
    if impl.kind is Kind.REFERENCE:
        out += ["NOTE: NOT standalone: the reference SyncBN needs the harness (harness.impls.reference) and its",
                "C++ kernels (built on first use); install syncbn-harness to run it."]
    if impl.kind is Kind.PLUGIN:
        out += [f"The implementation is imported by name: {impl.module}:{impl.attr} (found in "
                f"{impl.found_in} when written; that folder is a fallback on sys.path)."]
    return "\n".join("# " + ln if ln else "#" for ln in out)


def configuration(case: Case, impl_name: str, impl: Loading, device: str, timeout: float) -> str:
    """The file's settings, assigned after the launcher's defaults."""
    values = {"CASE": None, "IMPL_NAME": impl_name, "KIND": impl.kind.value, "DEVICE": device,
              "BACKEND": "nccl" if device == "cuda" else (case.backend or "gloo"), "TIMEOUT_S": timeout,
              "PLUGIN_MODULE": impl.module, "PLUGIN_ATTR": impl.attr, "FOUND_IN": impl.found_in,
              "EMBEDDED": True}
    lines = ["# ---- this reproduction " + "-" * 58,
             f"CASE = Case.from_dict(json.loads({json.dumps(case.to_dict())!r}))"]
    lines += [f"{k} = {v!r}" for k, v in values.items() if k != "CASE"]
    return "\n".join(lines) + "\n"


def repro_source(case: Case, impl_name: str, *, device: str, record=None, command: str = "",
                 filename: str = "repro.py", timeout: float = 300.0, loading: Optional[Loading] = None) -> str:
    """The text of the standalone file (see the module docstring); ``loading``: ``impl_name`` resolved already."""
    impl = loading or resolve_impl(impl_name)
    text = "\n".join([
        "#!/usr/bin/env python3",
        header(case, impl_name, device, impl, record, command),
        f'"""Standalone reproduction of {case.id} for {impl_name}; run: python {filename} (or under torchrun)."""',
        "from __future__ import annotations",
        "",
        harness_source(case),
        "",
        configuration(case, impl_name, impl, device, timeout),
        "",
        'if __name__ == "__main__":',
        "    sys.exit(main())",
        ""])
    compile(text, filename, "exec")
    return text
