"""Kernel lookup: registered kernels first, then etlab's kernel set (`etlab.ops`), nothing else.

Lookup order for an operator name: kernels registered with `register_kernel`, then the runtime's
own kernels for the non-ATen operators upstream emits, then torch's kernel for an operator on the
reviewed allowlist (out-variants of pure ATen operators, two of them bound to a faster
equivalent, see `_direct_kernels`). A file cannot make the runtime call any other torch operator
(`aten::from_file`, `aten::save`, ...). Kept apart from `_registry` so the kernel modules, which
build on `_registry`, are not imported back by it.
"""

from __future__ import annotations

from etlab import ops
from etlab.runtime._direct_kernels import direct_kernel
from etlab.runtime._prim_kernels import BUILTIN_KERNELS
from etlab.runtime._registry import KernelEntry, registered_kernel, registered_kernel_names
from etlab.runtime._torch_kernels import torch_kernel


def find_kernel(name: str) -> KernelEntry | None:
    """The kernel for operator `name`: a registered one, else one of etlab's kernel set, else None."""
    entry = registered_kernel(name)
    if entry is not None:
        return entry
    if not ops.allows_runtime(name):
        return None
    if name in BUILTIN_KERNELS:
        return BUILTIN_KERNELS[name]
    if not ops.allows_torch_kernel(name):
        return None
    return direct_kernel(name) or torch_kernel(name)


def missing_kernel_message(name: str) -> str:
    """Why no kernel was found for `name`, and how to provide one."""
    why = ("is not in etlab's kernel set (etlab.ops: the reviewed, side-effect-free operators)"
           if not ops.allows_runtime(name) or name.startswith("aten::") else "has no kernel")
    return (f"no kernel for operator '{name}': it {why}; if you trust this program, register one with "
            f"etlab.runtime.register_kernel({name!r}, fn)")


class OperatorRegistry:
    """The operators this runtime has kernels for (`operator_names`, a set of names)."""

    @property
    def operator_names(self) -> set[str]:
        """The operator names this runtime can run: registered custom kernels, built-in ones and the torch ops it
        calls directly."""
        return registered_kernel_names() | set(BUILTIN_KERNELS) | ops.runtime_torch_op_names()

    def has(self, name: str) -> bool:
        """Whether a program calling operator `name` ("aten::add.out") finds a kernel at load."""
        return find_kernel(name) is not None
