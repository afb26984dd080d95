"""The ATen operators a block of code calls, in order: what the runtime still computes per call (tests that
check work moved to load time or into the native core)."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode


class OpsSeen(TorchDispatchMode):
    """`with OpsSeen() as seen: ...` then `seen.names`: each dispatched operator's name (e.g. 'mul.Scalar')."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.__name__)
        return func(*args, **(kwargs or {}))
