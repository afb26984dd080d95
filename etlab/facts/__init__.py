"""Program facts: what the compiler records about a program and every layer above reads.

The leaf of etlab's layers (it imports only torch and `etlab.errors`):

- `etlab.facts.program_info`: `ProgramInfo` / `MethodInfo` / `OpInfo` / `DelegateInfo` /
  `DebugHandle`, the join keys between a compiled program and its runs (re-exported here).
- `etlab.facts.source`: where a node came from: the user's source line (innermost frame outside
  torch and etlab), the full stack, module paths (text helpers, no torch import).
- `etlab.facts.fx`: operator names of FX nodes, graph walks, graph copies.
- `etlab.facts.lowered`: `LoweredBackendModule`, `executorch_call_delegate`, and finding them in graphs.
- `etlab.facts.quant`: whether an operator (by name) quantizes or dequantizes; its name without overload.
- `etlab.facts.display`: how objects of lower layers get rich notebook reprs from the views.

Import the submodules you need; this package itself loads only the dataclasses, so that reading
a run (the Inspector without an ETRecord) starts without importing torch.
"""

from etlab.facts.program_info import DebugHandle, DelegateInfo, MethodInfo, OpInfo, ProgramInfo

__all__ = ["DebugHandle", "DelegateInfo", "MethodInfo", "OpInfo", "ProgramInfo"]
