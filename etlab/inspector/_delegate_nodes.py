"""Which graph nodes each event of a delegate ran, where the ETRecord cannot say: upstream's XNNPACK
delegate records an empty debug-identifier map, and its runtime names events after XNNPACK's
operators ("Convolution (NHWC, F32) IGEMM #1"), not after nodes.

The program's .pte can: the XNNPACK payload lists its nodes in execution order, each with the debug
handle of the Edge node it was lowered from (layout transposes the lowering added carry none), and
XNNPACK runs one operator, which logs one event, per node. So the k-th event a delegate call logs is
its k-th node. Handles the call covers that no node carries (a batch norm folded into the conv
before it, an activation turned into the conv's output clamp) belong to the node before them in
graph order: the op they were fused into.

Only used when the event counts fit (a multiple of the node count per call); otherwise the events
stay without handles, as before.
"""

from __future__ import annotations

import bisect
import os

from etlab.facts.program_info import ProgramInfo
from etlab.schema import load_pte
from etlab.schema.program import DelegateCall, PteFile
from etlab.schema.xnnpack import deserialize_xnnpack

XNNPACK = "XnnpackBackend"

# per MethodInfo (by id), per delegate call (chain, instruction): the handles of each node, in order
NodeHandles = dict[int, dict[tuple[int, int], list[tuple[int, ...] | None]]]


def read_pte(pte) -> PteFile:
    """A PteFile from a path, bytes or a PteFile (verified by the schema loader)."""
    if isinstance(pte, PteFile):
        return pte
    if isinstance(pte, (str, os.PathLike, bytes, bytearray, memoryview)):
        return load_pte(pte)
    raise TypeError(f"pte must be a path to a .pte, its bytes or a PteFile; got {type(pte).__name__}")


def node_handles(node_ids: list[int], covered: tuple[int, ...]) -> list[tuple[int, ...] | None]:
    """Per node (its recorded debug handle): the handles it ran. A node whose handle the call does not
    cover ran no Edge node (None); a covered handle no node carries joins the node with the nearest
    smaller handle (else the first node)."""
    cover = sorted(set(covered))
    own = sorted({h for h in node_ids if h in set(cover)})
    if not own:
        return [None] * len(node_ids)
    extra: dict[int, list[int]] = {h: [] for h in own}
    for h in cover:
        if h not in extra:
            i = bisect.bisect_left(own, h)
            extra[own[i - 1] if i > 0 else own[0]].append(h)
    out: list[tuple[int, ...] | None] = []
    given: set[int] = set()
    for h in node_ids:
        if h not in extra:
            out.append(None)
        elif h in given:  # an op lowered to several nodes: each names it, its fused ops go with the first
            out.append((h,))
        else:
            given.add(h)
            out.append(tuple(sorted({h, *extra[h]})))
    return out


def delegate_node_handles(pte, program: ProgramInfo) -> NodeHandles:
    """The node handles of every XNNPACK delegate call of the program whose ETRecord gives no
    debug-identifier map (see the module docstring); calls of other backends are left out."""
    pte = read_pte(pte)
    out: NodeHandles = {}
    for plan in pte.program.execution_plan or ():
        method = program.methods.get(str(plan.name))
        if method is None:
            continue
        calls: dict[tuple[int, int], list[tuple[int, ...] | None]] = {}
        for c, chain in enumerate(plan.chains or ()):
            for i, ins in enumerate(chain.instructions or ()):
                args = ins.instr_args
                if not isinstance(args, DelegateCall) or not 0 <= args.delegate_index < len(plan.delegates or ()):
                    continue
                delegate = plan.delegates[args.delegate_index]
                known = method.delegates.get((c, i))
                if delegate.id != XNNPACK or (known is not None and known.debug_handles):
                    continue
                graph = deserialize_xnnpack(pte.delegate_bytes(delegate), what=f"{plan.name}: delegate {i}").graph
                ids = [int(n.debug_handle or 0) for n in graph.xnodes or ()]
                calls[(c, i)] = node_handles(ids, tuple(method.instruction_debug_handles.get((c, i), ())))
        if calls:
            out[id(method)] = calls
    return out
