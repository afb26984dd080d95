"""Test cases to bundle with a program: inputs for one run of a method and the outputs it should give."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_flatten

# What a bundled value can be (the bundled-program schema's Value union).
ConfigValue = torch.Tensor | int | bool | float
SUPPORTED_TYPES = (torch.Tensor, int, bool, float)


def _flatten_checked(data, what: str) -> list[ConfigValue]:
    """Flattens nested lists/tuples/dicts (a lone value counts as one); every leaf must be a dense
    tensor, int, bool or float."""
    leaves, _ = tree_flatten(data)
    for i, leaf in enumerate(leaves):
        if not isinstance(leaf, SUPPORTED_TYPES):
            raise ValueError(f"{what}[{i}] has type {type(leaf).__name__}; bundled values must be "
                             "torch.Tensor, int, float or bool")
        if isinstance(leaf, torch.Tensor) and (leaf.layout != torch.strided or leaf.is_quantized):
            raise ValueError(f"{what}[{i}] is a {leaf.layout} / quantized tensor; only dense (strided, "
                             "non-quantized) tensors can be bundled")
    return [leaf.detach() if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]


class MethodTestCase:
    """Inputs for one execution of a method, and optionally the outputs it must produce.

    inputs: the method's inputs in order (nested containers are flattened, as torch.export
    flattens them). expected_outputs: omit to bundle inputs only (e.g. for profiling); to
    compare against the eager model, pass `model(*inputs)`.
    """

    def __init__(self, inputs: Sequence[ConfigValue], expected_outputs: Sequence[torch.Tensor] | None = None):
        self.inputs: list[ConfigValue] = _flatten_checked(inputs, "MethodTestCase inputs")
        self.expected_outputs: list[ConfigValue] = []
        if expected_outputs is not None:
            self.expected_outputs = _flatten_checked(expected_outputs, "MethodTestCase expected_outputs")

    def __repr__(self) -> str:
        return f"MethodTestCase(inputs={len(self.inputs)} values, expected_outputs={len(self.expected_outputs)} values)"


@dataclass
class MethodTestSuite:
    """All test cases for one method of the program."""

    method_name: str
    test_cases: Sequence[MethodTestCase]

    def __post_init__(self) -> None:
        if not isinstance(self.method_name, str) or not self.method_name:
            raise ValueError(f"MethodTestSuite method_name must be a non-empty str, got {self.method_name!r}")
        if isinstance(self.test_cases, MethodTestCase) or not isinstance(self.test_cases, Sequence):
            raise ValueError(f"MethodTestSuite {self.method_name!r}: test_cases must be a list of MethodTestCase, "
                             f"got {type(self.test_cases).__name__}")
        for i, case in enumerate(self.test_cases):
            if not isinstance(case, MethodTestCase):
                raise ValueError(f"MethodTestSuite {self.method_name!r}: test_cases[{i}] is a "
                                 f"{type(case).__name__}, not a MethodTestCase")
