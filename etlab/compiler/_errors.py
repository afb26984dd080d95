"""CompileError: what went wrong, on which op, and where in the user's model source."""

from __future__ import annotations

import torch

from etlab.errors import Error
from etlab.facts.fx import op_name
from etlab.facts.source import module_stack, source_line


class CompileError(Error, ValueError):
    """A model cannot be compiled. The message names the op and, when known, what the user called,
    in which module, and the user's source line.

    Attributes: `op` (readable op name or None), `source` ('file:line in fn: code' or None),
    `reason` (the bare explanation), `called` (the torch function or method the user called when the
    failing op is part of its decomposition: 'adaptive_avg_pool2d' for an `aten.as_strided_`, or None),
    `module` ('path (Type)' of the innermost enclosing module, or None).

    Why both: torch.export's stack traces keep only the frames of `forward` methods, so for a model
    whose forward delegates to a helper (torchvision's `_forward_impl`) the line is the outer call;
    the module path ('avgpool') and the call name the user's layer.
    """

    def __init__(self, reason: str, *, op: str | None = None, source: str | None = None,
                 called: str | None = None, module: str | None = None):
        self.op, self.source, self.reason, self.called, self.module = op, source, reason, called, module
        parts = [f"{op}: {reason}" if op else reason]
        where = []
        if called:
            where.append(f"from {called}")
        if module:
            where.append(f"in module {module}")
        if source:
            where.append(f"at {source}")
        if where:
            parts.append(f"({', '.join(where)})")
        super().__init__(" ".join(parts))

    @classmethod
    def at(cls, node: torch.fx.Node, reason: str) -> CompileError:
        """An error for `node`: its op name and the user source line that produced it."""
        op = op_name(node.target) if node.op == "call_function" else f"{node.op} {node.name}"
        return cls(reason, op=op, source=source_line(node.meta.get("stack_trace"), full_path=True) or None,
                   called=_called(node, op), module=_module(node))


def _called(node: torch.fx.Node, op: str) -> str | None:
    """The torch function the user called ('adaptive_avg_pool2d'), when the node's op is not it."""
    torch_fn = node.meta.get("torch_fn")
    if not isinstance(torch_fn, (tuple, list)) or len(torch_fn) != 2:
        return None
    name = str(torch_fn[1]).rsplit(".", 1)[-1]
    return None if not name or name in op.split(".") else name


def _module(node: torch.fx.Node) -> str | None:
    modules = module_stack(node.meta.get("nn_module_stack"))
    if not modules:
        return None
    path, ty = modules[-1]
    return f"{path} ({ty.rsplit('.', 1)[-1]})" if ty else path
