"""pytest puts tests/ itself on sys.path (tests/ is not a package), so a test folder named like an
installed top-level module (tests/packaging, tests/model_explorer, ...) shadows it for every test."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# jupyter_core's `jupyter.py` only serves `python -m jupyter`, which the tests run as a subprocess
# from the project root (make lab-server), never as an import.
KNOWN = {"jupyter"}


def test_no_test_folder_shadows_an_installed_module():
    saved = list(sys.path)
    try:
        sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != TESTS]
        clashes = []
        for d in sorted(p for p in TESTS.iterdir() if p.is_dir() and (p / "__init__.py").exists()
                       and p.name not in KNOWN):
            spec = importlib.util.find_spec(d.name) if d.name not in sys.modules else sys.modules[d.name].__spec__
            if spec is not None and spec.origin and not str(spec.origin).startswith(str(TESTS)):
                clashes.append(f"tests/{d.name} shadows {spec.origin}")
    finally:
        sys.path[:] = saved
    assert clashes == []
