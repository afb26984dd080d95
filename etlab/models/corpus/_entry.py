"""What a corpus entry is: a seeded factory, its methods' example inputs, dynamic shapes and tolerance."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.export import ExportedProgram

Inputs = tuple[Tensor, ...]
Built = tuple[nn.Module, dict[str, Inputs]]  # module, {method name: example inputs}


class MethodAsForward(nn.Module):
    """Exposes one named method of a module as `forward`, so torch.export can export it."""

    def __init__(self, module: nn.Module, method: str):
        super().__init__()
        self.module, self.method = module, method

    def forward(self, *args):
        """Calls the wrapped module's method on the same arguments."""
        return getattr(self.module, self.method)(*args)


@dataclass(frozen=True)
class CorpusEntry:
    """One architecture. `factory` builds the module (eval mode, random weights from `seed`) and its
    example inputs per method ('forward' for single-method models); `dynamic_shapes` gives the
    torch.export dynamic-shape spec per method where the model has one; outputs must match eager
    within `atol` + `rtol`·|eager|."""

    name: str
    source: str  # "torch.nn", "transformers", "torchvision", "timm" or "torchaudio"
    what: str  # the architecture feature the entry covers, one line
    factory: Callable[[], Built]
    dynamic_shapes: Callable[[], dict[str, Any]] | None = None
    atol: float = 1e-4
    rtol: float = 1e-4
    seed: int = 0
    tags: frozenset[str] = field(default_factory=frozenset)

    def build(self) -> Built:
        """The module and its inputs, built under this entry's seed without touching the caller's RNG."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            module, methods = self.factory()
        return module.eval(), methods

    def export(self, built: Built | None = None) -> dict[str, ExportedProgram]:
        """torch.export of every method (non-strict), with the entry's dynamic shapes."""
        module, methods = built or self.build()
        shapes = self.dynamic_shapes() if self.dynamic_shapes else {}
        out = {}
        with torch.no_grad():
            for method, inputs in methods.items():
                target = module if method == "forward" else MethodAsForward(module, method)
                out[method] = torch.export.export(target, tuple(inputs), dynamic_shapes=shapes.get(method),
                                                  strict=False)
        return out

    def eager(self, built: Built) -> dict[str, list[Tensor]]:
        """Eager outputs per method, flattened to a list of tensors (the order the program returns them)."""
        module, methods = built
        with torch.no_grad():
            return {m: flat_tensors(getattr(module, m)(*inputs)) for m, inputs in methods.items()}


def flat_tensors(value) -> list[Tensor]:
    """Tensors of a (nested) output in pytree order, the order an exported program's outputs take."""
    leaves = torch.utils._pytree.tree_leaves(value)
    return [t for t in leaves if isinstance(t, Tensor)]


def within_tolerance(got: Tensor, want: Tensor, atol: float, rtol: float) -> bool:
    """Elementwise |got - want| <= atol + rtol·|want|, shapes and dtypes equal."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    if not want.is_floating_point():
        return bool(torch.equal(got, want))
    return bool(torch.allclose(got, want, atol=atol, rtol=rtol, equal_nan=True))


def max_abs_error(got: list[Tensor], want: list[Tensor]) -> float:
    """Largest |got - want| over all outputs (inf when shapes differ or counts differ)."""
    if len(got) != len(want):
        return float("inf")
    worst = 0.0
    for g, w in zip(got, want):
        if g.shape != w.shape:
            return float("inf")
        if g.numel():
            worst = max(worst, float((g.double() - w.double()).abs().max()))
    return worst
