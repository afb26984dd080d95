"""Fixtures for the corpus tests: the upstream reference python, as the interop tests get it."""

from __future__ import annotations

from tests.interop.conftest import ref_python  # noqa: F401  (the interop tests' fixture, shared)


def load_bench_corpus():
    """bench/corpus.py as a module (by path: the name `corpus` is this test package's)."""
    import importlib.util
    import sys
    from pathlib import Path

    name = "etlab_bench_corpus"
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[2] / "bench" / "corpus.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
