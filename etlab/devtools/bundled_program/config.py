"""Test cases to bundle with a program (upstream's `bundled_program.config`): `MethodTestCase`
(inputs of one run of a method and the outputs it must give), `MethodTestSuite` (a method's cases),
and the type aliases of what they hold."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from etlab.devtools._bundled_config import ConfigValue, MethodTestCase, MethodTestSuite

MethodInputType = Sequence[ConfigValue]          # the inputs of one execution of a method
MethodOutputType = Sequence[torch.Tensor]        # the outputs one execution must give
DataContainer = list | tuple | dict              # containers inputs/outputs may nest in (flattened)

__all__ = ["ConfigValue", "DataContainer", "MethodInputType", "MethodOutputType", "MethodTestCase",
           "MethodTestSuite"]
