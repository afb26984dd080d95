"""The native forms of a dynamic-shape method's instructions (`dynamic.cpp`).

A method exported with dynamic dimensions computes sizes while it runs: `aten::sym_size.int` reads a tensor's
size, `executorch_prim::mul.Scalar` (add, floordiv, ...) combines sizes, and `et_view`, `expand_copy.out` and
friends take the results as their sizes. The Python core keeps these ints in its value table; the native core
keeps the ones only native steps write as *run-time ints* of its own (no GIL), and publishes them to the value
table where Python reads them: before a Python step that takes one as an argument, after a run for the
method's outputs and logged values.

A slot becomes a run-time int when every instruction writing it can run natively (a `sym_size` of a tensor
along a constant dimension, an integer operation on constants and run-time ints) and nothing else writes it
(an input, a move, another kernel). Kernels reading run-time ints get them patched into their arguments
before each call; view-copy out-variants on dynamic shapes run as the view, a resize of the output within its
planned memory, and a copy (ATen's composite out-variant clones the view first): no temporary, so none of
`_kernel_args`' result-size checks is needed, and a size past the plan's memory is the resize's clean error.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from etlab.runtime._direct_kernels import view_operator
from etlab.runtime._values import INT_LIST, TENSOR, ValueTable
from etlab.schema import program as P

SYM_SIZE = "aten::sym_size.int"
ET_VIEW = "executorch_prim::et_view.default"
DIM_ORDER_COPIES = ("dim_order_ops::_clone_dim_order.out", "dim_order_ops::_to_dim_order_copy.out")
_ARITHMETIC = ("add", "sub", "mul", "floordiv", "mod", "neg", "sym_max", "sym_min")
_COMPARISONS = ("eq", "gt", "lt", "ge", "le")
_INT_TYPES = ("int", "SymInt", "Optional[int]", "Optional[SymInt]", "List[int]", "List[SymInt]")
# view_copy.out reshapes (copies) a source it cannot view: left to ATen's kernel.
_NOT_AS_VIEW = ("aten::view_copy.out",)


def int_operation(name: str) -> str | None:
    """executorch_prim's integer operation named by kernel `name` ("executorch_prim::mul.Scalar" -> "mul")."""
    ns, _, rest = name.partition("::")
    base, _, overload = rest.partition(".")
    if ns != "executorch_prim" or overload not in ("Scalar", "int"):
        return None
    return base if base in _ARITHMETIC or base in _COMPARISONS else None


def _constant_int(table: ValueTable, slot: int) -> bool:
    v = table.values[slot]
    return table.kinds[slot] == "Int" and slot not in table.dynamic and isinstance(v, int) and not isinstance(v, bool)


@dataclass
class RunTimeInts:
    """The run-time ints of one method: slot -> whether it holds a bool (a comparison's result)."""

    table: ValueTable
    kinds: dict[int, bool] = field(default_factory=dict)

    def is_int(self, slot: int) -> bool:
        return self.kinds.get(slot) is False

    def operand(self, slot: int) -> tuple[int, int] | None:
        """(slot, -1) of a run-time int, (-1, value) of a constant int, None for anything else."""
        if self.is_int(slot):
            return slot, 0
        if _constant_int(self.table, slot):
            return -1, self.table.values[slot]
        return None

    def patches(self, schema, slots: list[int]) -> list[tuple[int, int, int]] | None:
        """(argument, element or -1, slot) for each run-time int a kernel reads; None when it reads another
        value that changes while running (the Python step resolves it)."""
        out = []
        for k, (param, slot) in enumerate(zip(schema.arguments, slots)):
            if self.table.resolver(slot) is None:
                continue
            if str(param.type) not in _INT_TYPES:
                return None
            if self.table.kinds[slot] == "Int" and self.is_int(slot):
                out.append((k, -1, slot))
                continue
            if self.table.kinds[slot] != INT_LIST:
                return None
            for j, m in enumerate(self.table.list_members[slot]):
                if m in self.table.dynamic:
                    if not self.is_int(m):
                        return None
                    out.append((k, j, m))
        return out


def _writes(entry, slots: list[int], table: ValueTable, ints: set[int]) -> int | None:
    """The slot a native int step of this kernel writes, with the run-time ints `ints` known, or None."""
    if entry.name == SYM_SIZE:
        ok = (len(slots) == 3 and table.kinds[slots[0]] == TENSOR and _constant_int(table, slots[1])
              and table.kinds[slots[2]] == "Int")
        return slots[2] if ok else None
    op = int_operation(entry.name)
    if op is None:
        return None
    arity = 1 if op == "neg" else 2
    if len(slots) != arity + 1:
        return None
    if table.kinds[slots[-1]] != ("Bool" if op in _COMPARISONS else "Int"):
        return None
    if not all(s in ints or _constant_int(table, s) for s in slots[:arity]):
        return None
    return slots[-1]


def run_time_ints(plan: P.ExecutionPlan, table: ValueTable, kernels: dict, chains) -> RunTimeInts:
    """The slots only native int steps write (see the module notes), to a fixpoint: an operation on an int
    that Python writes is a Python step, and its result then is Python's too."""
    writers: dict[int, list] = defaultdict(list)  # slot -> (entry, slots) of each writer; None: not native
    for slot in plan.inputs or []:
        writers[slot].append(None)
    for chain, bound in zip(plan.chains or [], chains):
        for instr, info in zip(chain.instructions or [], bound.infos):
            args = instr.instr_args
            if isinstance(args, P.KernelCall):
                entry, slots = kernels[info.operator], list(args.args or [])
                result = entry.result_slot(table, slots)
                if result is not None:
                    writers[result].append((entry, slots))
            elif isinstance(args, P.MoveCall):
                writers[args.move_to].append(None)
    ints = {s for s, ws in writers.items() if table.kinds[s] in ("Int", "Bool") and all(w is not None for w in ws)}
    changed = True
    while changed:
        known = {i for i in ints if table.kinds[i] == "Int"}
        keep = {s for s in ints if all(_writes(e, sl, table, known) == s for e, sl in writers[s])}
        changed = keep != ints
        ints = keep
    return RunTimeInts(table, {s: table.kinds[s] == "Bool" for s in sorted(ints)})


def declare(native, ints: RunTimeInts) -> None:
    for slot, is_bool in ints.kinds.items():
        value = ints.table.values[slot]
        native.declare_int(slot, int(value) if isinstance(value, (int, bool)) else 0, is_bool)


def add_int_step(native, c: int, entry, slots: list[int], ints: RunTimeInts) -> bool:
    """A sym_size or integer operation writing a run-time int, as a native step; False if it is not one."""
    if not slots or slots[-1] not in ints.kinds:
        return False
    if entry.name == SYM_SIZE:
        native.add_sym_size(c, entry.name, ints.table.values[slots[0]], ints.table.values[slots[1]], slots[2])
        return True
    operands = [ints.operand(s) for s in slots[:-1]]
    if any(o is None for o in operands):
        return False
    native.add_int_op(c, entry.name, int_operation(entry.name), operands, slots[-1])
    return True


def add_view_step(native, c: int, entry, slots: list[int], ints: RunTimeInts) -> bool:
    """et_view (a view re-pointed at its source's memory) with sizes from constants and run-time ints."""
    table = ints.table
    if entry.name != ET_VIEW or len(slots) != 3 or table.kinds[slots[1]] != INT_LIST:
        return False
    if table.kinds[slots[0]] != TENSOR or table.kinds[slots[2]] != TENSOR:
        return False
    sizes = [ints.operand(m) for m in table.list_members[slots[1]]]
    if any(s is None for s in sizes):
        return False
    native.add_view(c, entry.name, table.values[slots[0]], table.values[slots[2]], sizes)
    return True


def add_dim_order_copy(native, c: int, entry, slots: list[int], table: ValueTable) -> bool:
    """_clone_dim_order.out / _to_dim_order_copy.out (self, non_blocking, dim_order, out) as a native step."""
    if entry.name not in DIM_ORDER_COPIES or len(slots) < 4:
        return False
    src, dim_order, out = slots[0], slots[2], slots[3]
    if table.kinds[src] != TENSOR or table.kinds[out] != TENSOR or table.resolver(dim_order) is not None:
        return False
    order = table.values[dim_order]
    if order is not None and not (isinstance(order, list) and all(isinstance(d, int) for d in order)):
        return False
    try:
        native.add_dim_order_copy(c, entry.name, table.values[src], table.values[out], list(order or []))
    except (ValueError, TypeError):
        return False
    return True


def view_of(name: str, table: ValueTable, slots: list[int], patched: bool) -> tuple[str, str] | None:
    """(view operator, overload) a view-copy out-variant runs as (view, resize, copy) when its shapes are
    dynamic or its arguments are run-time ints; None to leave it to its kernel."""
    view = view_operator(name)
    if view is None or name in _NOT_AS_VIEW:
        return None
    op, schema = view
    returns = op._schema.returns
    if len(returns) != 1 or str(returns[0].type) != "Tensor" or len(op._schema.arguments) + 1 != len(schema.arguments):
        return None
    tensors = [s for s in slots[: len(schema.arguments)] if table.kinds[s] == TENSOR]
    if not patched and all(table.is_static_shape(s) for s in tensors):
        return None  # static: the small copy of `_plan._set_view_copy`, or ATen's kernel
    return op._schema.name, op._schema.overload_name


def python_reads(args, table: ValueTable) -> set[int]:
    """The slots an instruction run as a Python step reads (its arguments and their list members)."""
    if isinstance(args, (P.KernelCall, P.DelegateCall)):
        slots = list(args.args or [])
    elif isinstance(args, P.MoveCall):
        slots = [args.move_from]
    elif isinstance(args, P.JumpFalseCall):
        slots = [args.cond_value_index]
    else:
        return set()
    out = set(slots)
    for s in slots:
        out.update(m for m in table.list_members.get(s, []) if m >= 0)
    return out
