"""The runtime's event-name conventions live in one place (etlab.schema.etdump); everyone imports them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import etlab
from etlab.schema import etdump as E

ROOT = Path(etlab.__file__).parent
HOME = ROOT / "schema" / "etdump.py"
# The runtime's event writers still spell these names; their event tuples are being rewritten (issue #31, item 3).
PENDING = {ROOT / "runtime" / n for n in ("_event_tracer.py", "_program.py", "_method.py", "_interpreter.py")}
NAMES = {*E.FRAMEWORK_EVENT_NAMES, E.OPERATOR_CALL, E.DELEGATE_CALL}


def _code_strings(path: Path):
    """(line, text) of the string constants of a module that are not docstrings or `__all__` entries."""
    tree = ast.parse(path.read_bytes(), str(path))
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    docs |= {id(c) for n in ast.walk(tree) if isinstance(n, ast.Assign)
             and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets) for c in ast.walk(n.value)}
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            yield n.lineno, n.value


def _spellings(root: Path = ROOT) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        if "_generated" in path.parts or path == HOME:
            continue
        for line, text in _code_strings(path):
            if E.KERNEL_EVENT_PREFIX in text or (text in NAMES and path not in PENDING):
                found.append(f"{path.relative_to(root.parent)}:{line}: {text!r}")
    return found


def test_event_names_are_spelled_in_one_place():
    assert _spellings() == [], "import the name from etlab.schema.etdump"


def test_the_scan_sees_a_copy(tmp_path):
    pkg = tmp_path / "etlab"
    pkg.mkdir()
    (pkg / "a.py").write_text('"""native_call_ in a docstring is prose."""\nPREFIX = "native_call_"\n'
                              'FRAMEWORK = {"Method::init"}\n')
    assert _spellings(pkg) == ["etlab/a.py:2: 'native_call_'", "etlab/a.py:3: 'Method::init'"]


@pytest.mark.parametrize("operator,event,kernel", [
    ("aten::add.out", "native_call_add.out", "add.out"),
    ("quantized_decomposed::quantize_per_tensor.out", "native_call_quantize_per_tensor.out",
     "quantize_per_tensor.out"),
    ("relu", "native_call_relu", "relu"),
])
def test_kernel_event_names_round_trip(operator, event, kernel):
    assert E.kernel_event_name(operator) == event and E.kernel_of_event(event) == kernel


@pytest.mark.parametrize("name", ["native_call_", "OPERATOR_CALL", "Method::execute", "", "native_cal"])
def test_other_events_are_no_kernel(name):
    assert E.kernel_of_event(name) is None


def test_fleet_files_every_framework_event_as_framework():
    """The fleet store's categories come from the same names (it once missed etlab::dropped_debug_values)."""
    from etlab.fleet._events import _CAT, _classify

    for name in E.FRAMEWORK_EVENT_NAMES:
        assert _classify(name, False) == (_CAT["framework"], name)
    assert _classify("native_call_add.out", False) == (_CAT["kernel"], "add.out")
    assert _classify(E.OPERATOR_CALL, False)[0] == _CAT["operator"]
    assert _classify(E.DELEGATE_CALL, False)[0] == _CAT["delegate_call"]
