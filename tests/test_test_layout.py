"""pytest puts tests/ itself on sys.path (tests/ is not a package), so a test folder named like an
installed top-level module (tests/packaging, tests/model_explorer, ...) shadows it for every test; the
bench scripts put bench/ there (they import `_common`), and the corpus tests load bench/corpus.py."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
BENCH = TESTS.parent / "bench"
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


def test_no_bench_script_shadows_an_installed_module():
    saved = list(sys.path)
    try:
        sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() not in (TESTS, BENCH)]
        clashes = []
        for f in sorted(BENCH.glob("*.py")):
            spec = importlib.util.find_spec(f.stem) if f.stem not in sys.modules else sys.modules[f.stem].__spec__
            if spec is not None and spec.origin and not Path(spec.origin).resolve().is_relative_to(TESTS.parent):
                clashes.append(f"bench/{f.name} shadows {spec.origin}")
    finally:
        sys.path[:] = saved
    assert clashes == []
