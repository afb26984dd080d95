"""CompileError: what went wrong, on which op, and where in the user's model source."""

from __future__ import annotations

import torch

from etlab.errors import Error
from etlab.facts.fx import op_name
from etlab.facts.source import source_line


class CompileError(Error, ValueError):
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
        return cls(reason, op=op, source=source_line(node.meta.get("stack_trace"), full_path=True) or None)
