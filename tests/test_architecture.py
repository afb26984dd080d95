"""The import contract of ARCHITECTURE.md, checked on the source: layers only look down, no package
reaches into another's private modules or takes another package's private names, and no module
imports itself back through a cycle.

Every import counts, also one inside a function (a lazy import is still a dependency) and one by
name: a string that is a whole module name of another etlab package, as `importlib.import_module` or
a table of subcommands takes it (within a package such strings are logger names and resource
anchors). Skipped: only code that runs under a type checker alone (the body of `if TYPE_CHECKING:`,
the else of `if not TYPE_CHECKING:`). `from pkg import name` depends on `pkg.name` when that is a
module, else on `pkg` itself. Each module is parsed once per run (`scan` is cached).
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from dataclasses import dataclass
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
    "model_explorer": 9,
    "cli": 10, "demo": 10, "__main__": 10,
}

# Loads by name that go up on purpose (ARCHITECTURE.md, "views → analyses, upward, without an import"):
# the display registry imports the views package (or another engine's, facts.display.ENGINES) when nothing is
# registered yet.
UPWARD_BY_NAME = {("etlab.facts.display", "etlab.visualizer"), ("etlab.facts.display", "etlab.model_explorer")}


@dataclass(frozen=True)
class Import:
    """One dependency of a module: the etlab module it loads, the private name it takes from it (if
    any), the line, and how (`import`, `from`, or `name`: a module name in a string)."""

    target: str
    line: int
    how: str
    private_name: str | None = None


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(root: Path = ROOT) -> dict[str, Path]:
    return {_module_name(p, root): p for p in sorted(root.rglob("*.py")) if "_generated" not in p.parts}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """Nodes that run only under a type checker: the body of `if TYPE_CHECKING:`, the else of
    `if not TYPE_CHECKING:`. Nothing else (`if TYPE_CHECKING or x:` runs)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.If):
            continue
        if _is_type_checking(node.test):
            only_typing = node.body
        elif isinstance(node.test, ast.UnaryOp) and isinstance(node.test.op, ast.Not) \
                and _is_type_checking(node.test.operand):
            only_typing = node.orelse
        else:
            continue
        skip.update(id(n) for stmt in only_typing for n in ast.walk(stmt))
    return skip


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _imports_of(name: str, path: Path, tree: ast.AST, known: set[str]) -> list[Import]:
    skip = _type_checking_nodes(tree)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: list[Import] = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.extend(Import(a.name, node.lineno, "import") for a in node.names if a.name.split(".")[0] == "etlab")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            if base.split(".")[0] != "etlab":
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in known:
                    out.append(Import(sub, node.lineno, "from"))
                else:
                    out.append(Import(base, node.lineno, "from", alias.name if _is_private(alias.name) else None))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in known \
                and _package(node.value) not in (_package(name), "etlab") \
                and (name, node.value) not in UPWARD_BY_NAME:
            out.append(Import(node.value, node.lineno, "name"))
    return out


def scan(root: Path = ROOT) -> dict[str, tuple[Import, ...]]:
    """Module -> its etlab imports; every module parsed once (the checks below share the result)."""
    return _scan(root.resolve())


@functools.cache
def _scan(root: Path) -> dict[str, tuple[Import, ...]]:
    modules = _modules(root)
    known = set(modules) | {m.rsplit(".", 1)[0] for m in modules}
    return {name: tuple(i for i in _imports_of(name, path, ast.parse(path.read_bytes(), str(path)), known)
                        if i.target != name)
            for name, path in modules.items()}


def import_edges(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the etlab modules it imports."""
    return {name: {i.target for i in imports} for name, imports in scan(root).items()}


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


def private_name_violations(imports: dict[str, tuple[Import, ...]]) -> list[str]:
    """`from etlab.pkg.mod import _name` outside pkg: a private name taken through a public module."""
    return sorted(f"{src}:{i.line} -> {i.target}.{i.private_name}: private name of another package"
                  for src, found in imports.items() for i in found
                  if i.private_name and _package(src) != _package(i.target))


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


def test_no_private_names_across_packages():
    assert private_name_violations(scan()) == []


def test_no_import_cycles():
    assert cycles(import_edges()) == []


def test_the_checks_catch_violations():
    edges = {"etlab.schema.program": {"etlab.inspector._inspector"},
             "etlab.inspector._inspector": {"etlab.schema.program"}}
    assert layer_violations(edges) and private_violations(edges) and cycles(edges)


# -- each hole planted in a small fake etlab tree: the checks must see it ------------------------------------------

def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    """A fake etlab package under tmp_path (schema, inspector, cli and whatever `files` adds); its root."""
    base = {"__init__.py": "", "errors.py": "", "schema/__init__.py": "", "schema/program.py": "",
            "inspector/__init__.py": "from etlab.inspector._cli import main\n",
            "inspector/_cli.py": "def main(argv):\n    return 0\n\n\ndef _helper():\n    pass\n",
            "cli.py": "", **files}
    root = tmp_path / "etlab"
    for rel, text in base.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _all_violations(root: Path) -> list[str]:
    edges = import_edges(root)
    return layer_violations(edges) + private_violations(edges) + private_name_violations(scan(root)) + [
        " -> ".join(c) for c in cycles(edges)]


def test_a_clean_fake_tree_passes(tmp_path):
    root = _tree(tmp_path, {
        "cli.py": "from etlab.inspector import main\n",
        "inspector/_cli.py": "from etlab.inspector import _shared\nfrom etlab.schema import program\n",
        "inspector/_shared.py": "", "schema/program.py": "import logging\nlog = 'etlab.schema'\n"})
    assert _all_violations(root) == []


@pytest.mark.parametrize("source", [
    "if not TYPE_CHECKING:\n    from etlab.inspector import main\n",
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    pass\nelse:\n    from etlab.inspector import main\n",
    "import typing\nif not typing.TYPE_CHECKING:\n    import etlab.inspector\n",
    "if TYPE_CHECKING or True:\n    from etlab.inspector import main\n",
])
def test_type_checking_holes_are_closed(tmp_path, source):
    """Only code that runs under a type checker alone is skipped; `if not TYPE_CHECKING:` runs."""
    root = _tree(tmp_path, {"schema/program.py": source})
    assert any("schema (layer 1) may not import inspector" in v for v in layer_violations(import_edges(root)))


def test_type_checking_imports_are_still_skipped(tmp_path):
    root = _tree(tmp_path, {"schema/program.py": "if TYPE_CHECKING:\n    from etlab.inspector import main\n"
                                                  "if not TYPE_CHECKING:\n    pass\nelse:\n"
                                                  "    import etlab.inspector\n"})
    assert layer_violations(import_edges(root)) == []


@pytest.mark.parametrize("source", [
    "import importlib\n\ndef main(argv):\n    return importlib.import_module('etlab.inspector._cli').main(argv)\n",
    "TABLE = {'inspect': ('etlab.inspector._cli', 'main')}\n",
    "def main():\n    return __import__('etlab.inspector._cli')\n",
])
def test_string_imports_are_seen(tmp_path, source):
    root = _tree(tmp_path, {"cli.py": source})
    assert "etlab.cli -> etlab.inspector._cli: private module of another package" in private_violations(
        import_edges(root))


def test_string_imports_upward_are_layer_violations(tmp_path):
    root = _tree(tmp_path, {"schema/program.py": "VIEWS = 'etlab.inspector'\n"})
    assert layer_violations(import_edges(root)) == [
        "etlab.schema.program -> etlab.inspector: schema (layer 1) may not import inspector (layer 5)"]


def test_private_names_from_a_public_module_are_flagged(tmp_path):
    root = _tree(tmp_path, {"cli.py": "def f():\n    from etlab.inspector import _helper\n    return _helper\n",
                            "inspector/__init__.py": "from etlab.inspector._cli import _helper, main\n"})
    assert private_name_violations(scan(root)) == [
        "etlab.cli:2 -> etlab.inspector._helper: private name of another package"]


def test_cycles_in_a_fake_tree_are_found(tmp_path):
    root = _tree(tmp_path, {"schema/a.py": "from etlab.schema import b\n", "schema/b.py": "import etlab.schema.a\n"})
    assert cycles(import_edges(root)) == [["etlab.schema.a", "etlab.schema.b"]]


def test_each_module_is_parsed_once(tmp_path, monkeypatch):
    root = _tree(tmp_path, {"cli.py": "from etlab.inspector import main\n"})
    parsed: list[str] = []
    real = ast.parse
    monkeypatch.setattr(ast, "parse", lambda src, name="<unknown>", *a, **k: parsed.append(name) or real(src, name))
    layer_violations(import_edges(root))
    private_violations(import_edges(root))
    private_name_violations(scan(root))
    cycles(import_edges(root))
    assert sorted(parsed) == sorted(str(p) for p in _modules(root).values()) and len(parsed) == 7


def test_upward_loads_by_name_are_still_there():
    """Each allowed upward load by name is still in its module (a stale exception would hide a new one)."""
    for module, target in UPWARD_BY_NAME:
        path = _modules()[module]
        assert any(isinstance(n, ast.Constant) and n.value == target
                   for n in ast.walk(ast.parse(path.read_bytes(), str(path)))), (module, target)


@pytest.mark.parametrize("module", ["etlab.inspector", "etlab.etdump", "etlab.schema", "etlab.facts.source"])
def test_analysis_imports_stay_light(module):
    """Reading a run needs neither the compiler nor torch: tensors (and so torch) come in only with a
    debug buffer or an ETRecord, when they are read."""
    code = (f"import sys, {module}; heavy = [m for m in ('etlab.compiler', 'etlab.runtime', 'etlab.visualizer', "
            "'etlab.etrecord', 'torch') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
