"""Shared fixtures: zoo models exported once per test session (export dominates test time)."""

from __future__ import annotations

import functools

import pytest

from etlab.models import ZOO
from etlab.models import export_zoo as _export_zoo


@functools.cache
def exported(name: str):
    """(module, example_inputs, programs) where programs is an ExportedProgram or {method: ExportedProgram}."""
    module, inputs = ZOO[name]()
    return module, inputs, _export_zoo(name, module)


ZOO_UNDER_TEST = ["mlp", "cnn", "transformer", "kv_cache_decoder", "dynamic_batch", "two_methods", "cond"]


@pytest.fixture(params=ZOO_UNDER_TEST)
def zoo_program(request):
    return (request.param, *exported(request.param))


@pytest.fixture
def export_zoo():
    """The cached `exported(name)` function."""
    return exported
