"""The examples in public docstrings run as written (polars' style: an example that drifts fails here)."""

from __future__ import annotations

import doctest
import importlib

import pytest

# Modules whose public entry points carry examples; each must keep at least one.
MODULES = [
    "etlab.errors",
    # the file formats
    "etlab.schema.program", "etlab.schema._load_any", "etlab.schema.etdump", "etlab.schema.scalar_type",
    # export -> edge -> delegation -> .pte
    "etlab.compiler._manager", "etlab.compiler._tensor_spec",
    # profile a model in one call; a fleet of runs
    "etlab.devtools._profile", "etlab.fleet._ingest", "etlab.fleet._diff", "etlab.fleet._tags",
    # record, run, inspect
    "etlab.etrecord._etrecord", "etlab.etrecord._parse", "etlab.runtime._program", "etlab.inspector._inspector",
    # the views
    "etlab.visualizer._graph_view",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{name} has no examples left"
    assert result.failed == 0
