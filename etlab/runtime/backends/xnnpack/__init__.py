"""Runtime half of upstream ExecuTorch's XNNPACK delegate ("XnnpackBackend"), emulated with torch kernels.

etlab does not link XNNPACK: `init` decodes the delegate's blob (`etlab.schema.xnnpack`), checks
the graph completely and plans it; `execute` runs each XNNPACK node with torch (float kernels;
quantized values as dequantize -> float op -> requantize). Results match XNNPACK to float
rounding (and within one quantization step for quantized programs), not bit for bit, and the
speed is torch's, not XNNPACK's. What it adds: each delegated node reports a profiling event
and its output under its debug handle, so the Inspector can look inside the partition.
Where the native core is built, a partition's untraced and profiled calls are one native loop over its
nodes (`_native_plan`; nodes without a native form run as Python steps inside it).
"""

from etlab.runtime.backends.xnnpack._backend import XNNPACK_BACKEND, XnnpackBackendRuntime
from etlab.runtime.backends.xnnpack._graph import BACKEND_ID, XnnpackPlan
from etlab.runtime.backends.xnnpack._kernels import BUILDERS, TORCH_CALLS

SUPPORTED_NODE_KINDS = frozenset(BUILDERS)

__all__ = ["BACKEND_ID", "SUPPORTED_NODE_KINDS", "TORCH_CALLS", "XNNPACK_BACKEND", "XnnpackBackendRuntime",
           "XnnpackPlan"]
