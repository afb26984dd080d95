"""etlab's compiler for upstream ExecuTorch's XNNPACK delegate: partitioner, backend, refusals.

    from etlab.compiler import to_edge_transform_and_lower
    from etlab.compiler.backends.xnnpack import XnnpackPartitioner
    et = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()]).to_executorch()

`why_unsupported(node)` says why a node stays out of XNNPACK (a `DelegationRefusal`) or None.
"""

from etlab.compiler.backends.xnnpack._partitioner import XnnpackBackend, XnnpackPartitioner
from etlab.compiler.backends.xnnpack._support import why_unsupported

__all__ = ["XnnpackBackend", "XnnpackPartitioner", "why_unsupported"]
