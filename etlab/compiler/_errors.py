"""CompileError: what went wrong, on which op, and where in the user's model source."""

from __future__ import annotations

import re

import torch

_FRAME = re.compile(r'File "([^"]+)", line (\d+), in ([^\n]+)\n\s*([^\n]*)')


def source_line(node: torch.fx.Node | None) -> str | None:
    """The innermost user frame of a node's stack trace as 'file:line in fn: code', or None."""
    if node is None:
        return None
    trace = node.meta.get("stack_trace") or ""
    frames = _FRAME.findall(trace)
    if not frames:
        return None
    filename, lineno, fn, code = frames[-1]  # export traces list the innermost (user) frame last
    text = f"{filename}:{lineno} in {fn.strip()}"
    return f"{text}: {code.strip()}" if code.strip() else text


def op_name(target) -> str:
    """A readable operator name: 'aten.add.Tensor', 'cond', 'operator.getitem'."""
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._schema.name.split('::')[-1]}.{target._overloadname}"
    if isinstance(target, torch._ops.HigherOrderOperator):
        return target.name()
    name = getattr(target, "__name__", None)
    module = getattr(target, "__module__", None)
    return f"{module}.{name}" if name and module and module not in ("builtins", "_operator") else str(name or target)


class CompileError(ValueError):
    """A model cannot be compiled. The message names the op and, when known, the user's source line.

    Attributes: `op` (readable op name or None), `source` ('file:line in fn: code' or None),
    `reason` (the bare explanation).
    """

    def __init__(self, reason: str, *, op: str | None = None, source: str | None = None):
        self.op, self.source, self.reason = op, source, reason
        parts = [f"{op}: {reason}" if op else reason]
        if source:
            parts.append(f"(at {source})")
        super().__init__(" ".join(parts))

    @classmethod
    def at(cls, node: torch.fx.Node, reason: str) -> CompileError:
        """An error for `node`: its op name and the user source line that produced it."""
        op = op_name(node.target) if node.op == "call_function" else f"{node.op} {node.name}"
        return cls(reason, op=op, source=source_line(node))
