"""torch.export for zoo models, with each model's dynamic shapes and methods applied."""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from etlab.models.zoo import DYNAMIC_SHAPES, METHOD_INPUTS, ZOO


class MethodAsForward(torch.nn.Module):
    """Exposes one named method of a module as `forward`, so torch.export can export it."""

    def __init__(self, module: torch.nn.Module, method: str):
        super().__init__()
        self.module, self.method = module, method

    def forward(self, *args):
        """Calls the wrapped method."""
        return getattr(self.module, self.method)(*args)


def export_zoo(name: str, module: torch.nn.Module | None = None, *, strict: bool = False
               ) -> ExportedProgram | dict[str, ExportedProgram]:
    """Exports zoo model `name` (a key of ZOO): one ExportedProgram, or {method: program} for
    multi-method models (METHOD_INPUTS). Pass `module` to export an instance you already built."""
    if name not in ZOO:
        raise KeyError(f"no zoo model {name!r}; choose from {sorted(ZOO)}")
    factory = ZOO[name]
    if module is None:
        module, inputs = factory()
    else:
        inputs = factory()[1]
    key = factory.__name__
    with torch.no_grad():
        if key in METHOD_INPUTS:
            return {m: torch.export.export(MethodAsForward(module, m), tuple(ins), strict=strict)
                    for m, ins in METHOD_INPUTS[key].items()}
        return torch.export.export(module, tuple(inputs), dynamic_shapes=DYNAMIC_SHAPES.get(key), strict=strict)
