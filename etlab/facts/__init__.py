"""Program facts: what the compiler records about a program and every layer above reads.

The leaf of etlab's layers (it imports only torch and `etlab.errors`):

- `etlab.facts.program_info`: `ProgramInfo` / `MethodInfo` / `OpInfo` / `DelegateInfo` /
  `DebugHandle`, the join keys between a compiled program and its runs (re-exported here).
- `etlab.facts.fx`: one helper per fact of an FX node: operator names, the user's source line,
  module paths, graph walks.
- `etlab.facts.lowered`: `LoweredBackendModule`, `executorch_call_delegate`, and finding them in graphs.
- `etlab.facts.display`: how objects of lower layers get rich notebook reprs from the views.

Import the submodules you need; this package itself loads only the dataclasses, so that the
Inspector starts without torch.fx machinery it does not use.
"""

from etlab.facts.program_info import DebugHandle, DelegateInfo, MethodInfo, OpInfo, ProgramInfo

__all__ = ["DebugHandle", "DelegateInfo", "MethodInfo", "OpInfo", "ProgramInfo"]
