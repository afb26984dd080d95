"""Backends shipped with etlab's compiler (ahead-of-time halves).

- `DemoBackend` / `DemoPartitioner`: float32 add, mul and linear (mm/addmm/permute) partitions;
  its runtime half is `etlab.runtime.backends.demo_backend`.
"""

from etlab.compiler.backends._demo_backend import DemoBackend, DemoPartitioner, why_unsupported

__all__ = ["DemoBackend", "DemoPartitioner", "why_unsupported"]
