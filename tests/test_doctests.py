"""The examples in public docstrings run as written (polars' style: an example that drifts fails here)."""

from __future__ import annotations

import doctest
import importlib

import pytest

# Modules whose public entry points carry examples; each must keep at least one.
MODULES = ["etlab.errors", "etlab.schema.etdump", "etlab.schema.scalar_type", "etlab.fleet._diff", "etlab.fleet._tags",
           "etlab.compiler._tensor_spec"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{name} has no examples left"
    assert result.failed == 0
