"""The package's shape: modules that can be walked into (a docstring each, small), and one import direction.

Every import counts, at the top of a module or inside a function: an import
deferred into a function is still a dependency, and a circle made of them is
still a circle, and no module of the package is on one. The packages are
layered (:data:`LAYERS`, lowest first); a module may import its own package and
the layers below it, never above. One pair of peers may import each other:
``harness.catalog`` imports the list of families in ``cases/`` (and the
families by name), and each family imports the catalog's ``Case`` and
covering arrays, modules that import no family. Each package's docstring is
its index: it names every module in it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"harness": ROOT / "harness", "harness.cases": ROOT / "cases", "harness.kernels": ROOT / "kernels"}
MAX_LINES = 420

# Lowest first. A name is a top-level module or subpackage of ``harness``; ``harness`` is the package's own
# ``__init__`` (its version). Units on one row are peers: they do not import each other.
LAYERS = [
    ("harness", "errors", "paths"),  # version, the error types, where things live
    ("procs",),                      # child processes in sessions of their own, stopped and reaped
    ("cache",),                      # what the cache holds, listed and pruned
    ("slices",),                     # large tensors worked a batch slice at a time
    ("catalog", "cases"),            # the case type and the families (registration by import: the one circle)
    ("kernels",),                    # the reference's C++/CUDA extension
    ("judge",),                      # the float64 oracle, tolerances, metrics, invariants
    ("impls",),                      # the adapters under test
    ("results",),                    # records, the store, reports, the gate's rules
    ("buildinfo",),                  # the build under test
    ("selection",),                  # flags -> cases, adapters, run options
    ("scenarios",),                  # what a rank does with a case
    ("engine",),                     # pools, ranks, torchrun, attribution, the run plan
    ("repro",),                      # standalone repro files
    ("search", "bisect"),            # exploring the case space; bisecting builds
    ("history",),                    # the selection across torch releases, its page
    ("bench",),                      # benchmarks: kernels, the pool, whole commands, the store
    ("gpu_suite",),                  # everything CUDA on a GPU machine, bounded and packed
    ("undo",),                       # torch's SyncBN changes undone and its code mutated, judged by the cases
    ("commands",),                   # the command line
    ("__main__",),                   # ``python -m harness``
]
# Files in cases/ that pytest collects (the catalog as a test suite): they sit above everything.
PYTEST_FILES = {"harness.cases.conftest", "harness.cases.test_cases"}
ALLOWED_CIRCLE = {("catalog", "cases"), ("cases", "catalog")}


def modules() -> dict[str, Path]:
    out = {}
    for prefix, root in FOLDERS.items():
        for p in root.rglob("*.py"):
            if "__pycache__" in p.parts:
                continue
            parts = [x for x in p.relative_to(root).with_suffix("").parts if x != "__init__"]
            out[".".join([prefix, *parts])] = p
    return out


def imports(p: Path, known: dict) -> set[str]:
    """Every harness module ``p`` imports, wherever the import statement is (module level, function, class)."""
    deps = set()
    for node in ast.walk(ast.parse(p.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("harness"):
            for a in node.names:
                deps.add(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module)
        elif isinstance(node, ast.Import):
            deps |= {a.name for a in node.names if a.name.startswith("harness")}
    return {d for d in deps if d in known}


def unit(module: str) -> str:
    """The layer unit of a module: its first name under ``harness`` (``harness`` itself for the package)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "harness"


def level(module: str) -> int:
    if module in PYTEST_FILES:
        return len(LAYERS)
    for i, row in enumerate(LAYERS):
        if unit(module) in row:
            return i
    raise AssertionError(f"{module} is in no layer of tests/test_layout.py: add its package to LAYERS")


def test_every_import_follows_the_layers():
    mods = modules()
    wrong = []
    for name, p in mods.items():
        for dep in imports(p, mods):
            a, b = unit(name), unit(dep)
            if a == b or name in PYTEST_FILES or (a, b) in ALLOWED_CIRCLE:
                continue
            if level(dep) >= level(name):
                wrong.append(f"{name} -> {dep} ({a} is at layer {level(name)}, {b} at {level(dep)})")
    assert not wrong, "imports against the layering:\n  " + "\n  ".join(sorted(wrong))


def test_no_import_cycles_between_harness_modules():
    mods = modules()
    graph = {name: imports(p, mods) - {name} for name, p in mods.items()}

    def reaches(start, goal, seen):
        for nxt in graph[start]:
            if nxt == goal or (nxt not in seen and (seen.add(nxt) or reaches(nxt, goal, seen))):
                return True
        return False

    cyclic = sorted(m for m in graph if reaches(m, m, set()))
    assert not cyclic, f"modules on an import cycle: {cyclic}"


def test_every_module_is_small_and_says_what_it_is():
    for name, p in modules().items():
        text = p.read_text()
        assert ast.get_docstring(ast.parse(text)), f"{name} has no docstring"
        assert text.count("\n") <= MAX_LINES, f"{name} has {text.count(chr(10))} lines: split it by concept"
        assert "SPEC §" not in text and "SPEC.md" not in text, f"{name} cites a file outside the repository"


def test_every_package_docstring_names_its_modules():
    """A package's docstring is its index: it names every module and subpackage in it (``:mod:`` references).
    The command line is exempt: each of its modules is one subcommand, named by ``syncbn-harness --help``."""
    missing = []
    for pkg in sorted(ROOT.joinpath("harness").rglob("__init__.py")):
        folder = pkg.parent
        if folder.name == "commands" or "__pycache__" in folder.parts:
            continue
        doc = ast.get_docstring(ast.parse(pkg.read_text())) or ""
        names = [p.stem for p in folder.glob("*.py") if p.stem not in ("__init__", "__main__")
                 and not p.stem.startswith("_")]
        names += [p.name for p in folder.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
        missing += [f"{folder.relative_to(ROOT)}/{n}" for n in sorted(names)
                    if not re.search(rf"(\.|~|`){re.escape(n)}\b", doc)]
    assert not missing, "modules no package docstring names: " + ", ".join(missing)
