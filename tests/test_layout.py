"""The package's shape: modules that can be walked into (a docstring each, small), no import cycles."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"harness": ROOT / "harness", "harness.cases": ROOT / "cases", "harness.kernels": ROOT / "kernels"}
MAX_LINES = 420


def modules() -> dict[str, Path]:
    out = {}
    for prefix, root in FOLDERS.items():
        for p in root.rglob("*.py"):
            if "__pycache__" in p.parts:
                continue
            parts = [x for x in p.relative_to(root).with_suffix("").parts if x != "__init__"]
            out[".".join([prefix, *parts])] = p
    return out


def imports_at_top(p: Path, known: dict) -> set[str]:
    deps = set()
    for node in ast.parse(p.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("harness"):
            for a in node.names:
                deps.add(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module)
        elif isinstance(node, ast.Import):
            deps |= {a.name for a in node.names if a.name.startswith("harness")}
    return {d for d in deps if d in known}


def test_no_import_cycles_between_harness_modules():
    mods = modules()
    graph = {name: imports_at_top(p, mods) - {name} for name, p in mods.items()}

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
