"""The etlab runtime: loads `.pte` programs and runs their methods (upstream's `executorch.runtime` API).

    from etlab.runtime import Runtime

    program = Runtime.get().load_program("model.pte")
    method = program.load_method("forward")
    outputs = method.execute([x])

- Memory follows the program's plan: one arena per memory id, every planned tensor a view at
  its offset, constants zero-copy views of the file. Outputs are copies.
- Kernels come from a registry keyed by operator name (`"aten::add.out"`): torch's kernels for
  the reviewed operators of `etlab.ops`, the non-ATen ones upstream emits, and
  `register_kernel(name)(fn)` for custom ones. Any other operator fails at load.
  Delegates run on backends added with `register_backend(name, backend)`.
- `enable_etdump=True` records an ETDump (`Program.write_etdump_result_to_file`) that
  upstream's Inspector reads.
- Threads: share a Program freely; use each Method from one thread at a time. Kernels run on 1
  intra-op thread by default, as upstream's portable runtime (stable profiles on a busy machine);
  `load_program(..., threads=N)` gives them N (None: torch's own setting). Traced runs record it.
"""

from etlab.runtime._delegate import BackendInitContext, DelegateContext, NullDelegateContext
from etlab.runtime._errors import ExecutionError, LoadError
from etlab.runtime._event_tracer import DebugLevel
from etlab.runtime._lookup import OperatorRegistry
from etlab.runtime._meta import MethodMeta, ScalarInfo, TensorInfo
from etlab.runtime._method import Method
from etlab.runtime._program import Program, Runtime, Verification, load_program
from etlab.runtime._registry import (
    BackendRegistry,
    register_backend,
    register_kernel,
    unregister_backend,
    unregister_kernel,
)

__all__ = [
    "BackendInitContext",
    "BackendRegistry", "DebugLevel", "DelegateContext", "ExecutionError", "LoadError", "Method", "MethodMeta",
    "NullDelegateContext", "OperatorRegistry", "Program", "Runtime", "ScalarInfo", "TensorInfo", "Verification",
    "load_program", "register_backend", "register_kernel", "unregister_backend", "unregister_kernel",
]
