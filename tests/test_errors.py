"""etlab.Error is the one root of etlab's own errors, and each keeps its builtin base."""

from __future__ import annotations

import ast
import importlib
import json
import re
from pathlib import Path

import pytest

import etlab
from etlab.errors import Error, FormatError

ROOT = Path(etlab.__file__).parent

# Exceptions that never leave the module that raises them (control flow, not errors a caller sees).
INTERNAL = {"StepFailed", "NeedsRetrace", "WorkerLost", "_Parsed", "_Uncacheable", "_UsageError"}


def _exception_classes() -> list[tuple[str, str]]:
    """(module, class) of every top-level class in etlab's source whose bases name an Error or Exception.
    Runs at collection: only files with such a class line are parsed."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        text = path.read_text()
        if "_generated" in path.parts or not re.search(r"^class \w+\(.*(Error|Exception)\b", text, re.M):
            continue
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in ast.parse(text, str(path)).body:
            if isinstance(node, ast.ClassDef) and any(
                    ast.unparse(b).endswith(("Error", "Exception")) for b in node.bases):
                found.append((module, node.name))
    return found


def test_the_scan_finds_the_known_errors():
    names = {name for _, name in _exception_classes()}
    assert {"FormatError", "LoadError", "ExecutionError", "CompileError", "DelegationError",
            "BundledVerificationError", "PairingError", "PathError"} <= names


@pytest.mark.parametrize("module,name", [c for c in _exception_classes() if c[1] not in INTERNAL])
def test_every_etlab_error_is_an_etlab_error(module, name):
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, Error), f"{module}.{name} must derive from etlab.Error (etlab/errors.py)"


@pytest.mark.parametrize("cls,builtin", [
    ("etlab.FormatError", ValueError), ("etlab.runtime.LoadError", RuntimeError),
    ("etlab.runtime.ExecutionError", RuntimeError), ("etlab.compiler.CompileError", ValueError),
    ("etlab.compiler.DelegationError", ValueError), ("etlab.devtools.BundledVerificationError", AssertionError),
    ("etlab.inspector.PairingError", ValueError),
])
def test_public_errors_keep_their_builtin_base(cls, builtin):
    module, name = cls.rsplit(".", 1)
    err = getattr(importlib.import_module(module), name)
    assert issubclass(err, Error) and issubclass(err, builtin)
    with pytest.raises(Error):
        raise err("x") if name != "CompileError" else err("x", op="aten::add")


def test_error_is_exported_and_catches_only_etlab_errors():
    assert etlab.Error is Error and "Error" in etlab.__all__
    with pytest.raises(KeyError):
        try:
            raise KeyError("a bug, not a bad file")
        except Error:
            pytest.fail("etlab.Error caught a builtin KeyError")


def test_verify_child_reports_etlab_errors_and_lets_bugs_through(tmp_path, monkeypatch, capsys):
    """The Lab server's verification child turns a bad file into a report, and a bug into a traceback."""
    from etlab.jupyter import _verify

    bad = tmp_path / "bad.bpte"
    bad.write_bytes(b"not a bundled program at all")
    assert _verify.main([str(bad), "bad.bpte"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["file"] == "bad.bpte" and "error" in report and str(tmp_path) not in report["error"]

    def buggy(path, name, *tolerances):
        raise KeyError("bug")

    monkeypatch.setattr(_verify, "verify", buggy)
    with pytest.raises(KeyError):
        _verify.main([str(bad), "bad.bpte"])
    monkeypatch.setattr(_verify, "verify", lambda p, n, *t: (_ for _ in ()).throw(FormatError(f"{p}: defect")))
    assert _verify.main([str(bad), "bad.bpte"]) == 0
    assert json.loads(capsys.readouterr().out)["error"] == "FormatError: bad.bpte: defect"
