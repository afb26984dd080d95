"""Backends shipped with etlab's compiler (ahead-of-time halves).

- `DemoBackend` / `DemoPartitioner`: float32 add, mul and linear (mm/addmm/permute) partitions;
  its runtime half is `etlab.runtime.backends.demo_backend`.
- `XnnpackBackend` / `XnnpackPartitioner`: upstream ExecuTorch's XNNPACK delegate (its payload
  format, run by upstream's runtime and by `etlab.runtime.backends.xnnpack`); `xnnpack_why_unsupported`
  says why a node stays out of it.
"""

from etlab.compiler.backends._demo_backend import DemoBackend, DemoPartitioner, why_unsupported
from etlab.compiler.backends.xnnpack import XnnpackBackend, XnnpackPartitioner
from etlab.compiler.backends.xnnpack import why_unsupported as xnnpack_why_unsupported

__all__ = ["DemoBackend", "DemoPartitioner", "XnnpackBackend", "XnnpackPartitioner", "why_unsupported",
           "xnnpack_why_unsupported"]
