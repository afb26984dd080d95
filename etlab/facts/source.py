"""Where a node came from: the user's source line and the nn.Module path, from its FX metadata.

Plain text and dict helpers (no torch import), so that reading a run's ETDump and ETRecord facts
stays light:

- Source lines: a node's `stack_trace` lists frames outermost first, torch's own frames among
  them (an `nn.Conv2d` node's innermost frame is torch's `conv.py`). `user_frame` is the innermost
  frame outside torch and etlab: the line of the user's model that produced the op; the whole
  stack stays available through `stack_frames`.
- Modules: `nn_module_stack` maps a key to (module path, module type), outermost first.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass


def _package_dir(name: str) -> str:
    spec = importlib.util.find_spec(name)
    origin = spec.origin if spec is not None and spec.origin else ""
    return os.path.dirname(origin) + os.sep if origin else "\0"


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in ([^\n]+)(?:\n(?!\s*File ")\s*([^\n]*))?')
_TORCH_DIR = _package_dir("torch")
_ETLAB_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


@dataclass(frozen=True)
class Frame:
    """One frame of a stack trace: where, in which function, and the line of code (may be "")."""

    filename: str
    lineno: int
    name: str
    code: str = ""

    def is_library(self) -> bool:
        """A frame of torch's or etlab's own code, not the user's."""
        return self.filename.startswith((_TORCH_DIR, _ETLAB_DIR))

    def short(self, full_path: bool = False) -> str:
        """'model.py:12 in forward: x = self.fc(x)' (the file's base name unless full_path)."""
        where = self.filename if full_path else os.path.basename(self.filename)
        text = f"{where}:{self.lineno} in {self.name}"
        return f"{text}: {self.code}" if self.code else text


def stack_frames(stack_trace: str | None) -> list[Frame]:
    """The frames of a stack trace as torch.export records it, outermost first."""
    return [Frame(f, int(line), name.strip(), (code or "").strip())
            for f, line, name, code in _FRAME.findall(stack_trace or "")]


def user_frame(stack_trace: str | None) -> Frame | None:
    """The innermost frame outside torch and etlab; failing that (a model defined in etlab's own zoo),
    the innermost outside torch; failing that, the innermost frame."""
    frames = stack_frames(stack_trace)
    for keep in (lambda f: not f.is_library(), lambda f: not f.filename.startswith(_TORCH_DIR), lambda f: True):
        picked = [f for f in frames if keep(f)]
        if picked:
            return picked[-1]
    return None


def source_line(stack_trace: str | None, full_path: bool = False) -> str:
    """The user's line that produced a node, as 'model.py:12 in forward: code' ("" when unknown)."""
    frame = user_frame(stack_trace)
    return frame.short(full_path) if frame is not None else ""


# --- module hierarchy ---------------------------------------------------------------------------


def module_hierarchy(stack) -> dict[str, tuple[str, str]] | None:
    """An nn_module_stack normalised to key -> (module path, qualified type name), outermost first."""
    if not stack:
        return None
    out = {}
    for key, val in stack.items():
        path, ty = val if isinstance(val, (tuple, list)) and len(val) == 2 else (str(val), "")
        if isinstance(ty, type):
            ty = f"{ty.__module__}.{ty.__qualname__}"
        out[str(key)] = (str(path), str(ty))
    return out


def module_stack(stack) -> list[tuple[str, str]]:
    """(path, type name) of the enclosing modules, outermost first, the root module left out."""
    out = []
    for val in (stack or {}).values():
        path, ty = (val[0], val[1]) if isinstance(val, (tuple, list)) and len(val) >= 2 else (str(val), "")
        ty = getattr(ty, "__name__", None) or str(ty)
        if path:
            out.append((str(path), ty))
    return out


def module_path(stack) -> str:
    """The innermost module path of an nn_module_stack ("" when there is none)."""
    modules = module_stack(stack)
    return modules[-1][0] if modules else ""
