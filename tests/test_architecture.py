"""The import contract of ARCHITECTURE.md, checked on the source: layers only look down, no package
reaches into another's private modules, and no module imports itself back through a cycle.

Every import counts, also one inside a function (a lazy import is still a dependency), except those
under `if TYPE_CHECKING:`. `from pkg import name` depends on `pkg.name` when that is a module, else
on `pkg` itself.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "etlab"

# Package -> layer. A package may import packages of lower layers only (and itself).
LAYERS = {
    "errors": 0, "etlab": 1,
    "schema": 1,
    "facts": 2, "ops": 2, "models": 2,
    "etdump": 3, "etrecord": 3,
    "compiler": 4, "runtime": 4,
    "inspector": 5,
    "devtools": 6, "fleet": 6,
    "visualizer": 7,
    "jupyter": 8,
    "cli": 9, "demo": 9, "__main__": 9,
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in ROOT.rglob("*.py") if "_generated" not in p.parts}


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def import_edges() -> dict[str, set[str]]:
    """Module -> the etlab modules it imports."""
    modules = _modules()
    known = set(modules) | {m.rsplit(".", 1)[0] for m in modules}
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_checking_nodes(tree)
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        out: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name.split(".")[0] == "etlab")
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                if base.split(".")[0] != "etlab":
                    continue
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    out.add(sub if sub in known else base)
        edges[name] = {t for t in out if t != name}
    return edges


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "etlab"


def layer_violations(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for src, targets in edges.items():
        ps = _package(src)
        for dst in targets:
            pd_ = _package(dst)
            if ps == pd_:
                continue
            if ps not in LAYERS or pd_ not in LAYERS:
                bad.append(f"{src} -> {dst}: package not in the layer table (tests/test_architecture.py LAYERS)")
            elif LAYERS[pd_] >= LAYERS[ps]:
                bad.append(f"{src} -> {dst}: {ps} (layer {LAYERS[ps]}) may not import {pd_} (layer {LAYERS[pd_]})")
    return sorted(bad)


def private_violations(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for src, targets in edges.items():
        for dst in targets:
            if _package(src) != _package(dst) and any(p.startswith("_") for p in dst.split(".")[2:]):
                bad.append(f"{src} -> {dst}: private module of another package")
    return sorted(bad)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_every_package_has_a_layer():
    packages = {_package(m) for m in _modules()}
    assert packages <= set(LAYERS), f"add to LAYERS (and ARCHITECTURE.md): {sorted(packages - set(LAYERS))}"


def test_layers_only_look_down():
    assert layer_violations(import_edges()) == []


def test_no_private_imports_across_packages():
    assert private_violations(import_edges()) == []


def test_no_import_cycles():
    assert cycles(import_edges()) == []


def test_the_checks_catch_violations():
    edges = {"etlab.schema.program": {"etlab.inspector._inspector"},
             "etlab.inspector._inspector": {"etlab.schema.program"}}
    assert layer_violations(edges) and private_violations(edges) and cycles(edges)


@pytest.mark.parametrize("module", ["etlab.inspector", "etlab.etdump", "etlab.schema", "etlab.facts.source"])
def test_analysis_imports_stay_light(module):
    """Reading a run needs neither the compiler nor torch: tensors (and so torch) come in only with a
    debug buffer or an ETRecord, when they are read."""
    code = (f"import sys, {module}; heavy = [m for m in ('etlab.compiler', 'etlab.runtime', 'etlab.visualizer', "
            "'etlab.etrecord', 'torch') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
