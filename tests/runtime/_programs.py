"""Hand-built .pte programs for runtime tests (no compiler involved).

`PlanBuilder` appends values and instructions the way upstream's emitter lays them out: a
KernelCall's args are the schema's arguments in order (out arguments included) followed by the
return slot. `ProgramBuilder` holds the constants, mutable-buffer initial states and delegate
data. Ready-made programs: `add_chain`, `branch_program` (JumpFalseCall/MoveCall),
`accumulator_program` (a mutable buffer), `dynamic_view_program` (symbolic sizes, et_view), and
`delegate_program` with its test backend `ScaleBackend`.
"""

from __future__ import annotations

import torch

from etlab.schema import dtype_to_scalar_type, serialize_pte
from etlab.schema import program as P

ALIGN = 16


class PlanBuilder:
    def __init__(self, name: str = "forward"):
        self.name = name
        self.values: list[P.EValue] = []
        self.instructions: list[P.Instruction] = []
        self.operators: list[P.Operator] = []
        self.delegates: list[P.BackendDelegate] = []
        self.arena = 0
        self.constants: list[bytes] = []  # filled in by ProgramBuilder

    def _add(self, val) -> int:
        self.values.append(P.EValue(val))
        return len(self.values) - 1

    def int(self, v: int) -> int:
        return self._add(P.Int(v))

    def double(self, v: float) -> int:
        return self._add(P.Double(v))

    def bool(self, v: bool) -> int:
        return self._add(P.Bool(v))

    def null(self) -> int:
        return self._add(P.Null())

    def int_list(self, items) -> int:
        """An IntList; items are ints (made into Int values) or value indices given as ("v", idx)."""
        idx = [i[1] if isinstance(i, tuple) else self.int(i) for i in items]
        return self._add(P.IntList(idx))

    def tensor_list(self, items: list[int]) -> int:
        return self._add(P.TensorList(list(items)))

    def tensor(self, shape, dtype=torch.float32, *, planned: bool = True, data: torch.Tensor | None = None,
               dynamic: bool = False, dim_order=None, program=None, initial: torch.Tensor | None = None,
               external: str | None = None) -> int:
        """A tensor value: constant (`data`), planned (with an `initial` state: a mutable buffer),
        external (`external` = its key in a .ptd) or unplanned (`planned=False`)."""
        shape = list(shape)
        alloc = None
        buffer_idx = 0
        extra = None
        if data is not None:
            buffer_idx = program.add_constant(data.to(dtype).contiguous())
        elif external is not None:
            extra = P.ExtraTensorInfo(fully_qualified_name=external, location=P.TensorDataLocation.EXTERNAL)
        elif planned:
            if initial is not None:
                buffer_idx = program.add_mutable_initial(initial.to(dtype))
            nbytes = torch.empty(shape, dtype=dtype).nbytes
            alloc = P.AllocationDetails(memory_id=1, memory_offset_low=self.arena, memory_offset_high=0)
            self.arena += -(-max(nbytes, 1) // ALIGN) * ALIGN
        return self._add(P.Tensor(
            scalar_type=dtype_to_scalar_type(dtype), sizes=shape,
            dim_order=list(dim_order) if dim_order is not None else list(range(len(shape))),
            data_buffer_idx=buffer_idx, allocation_info=alloc, extra_tensor_info=extra,
            shape_dynamism=P.TensorShapeDynamism.DYNAMIC_BOUND if dynamic else P.TensorShapeDynamism.STATIC))

    def kernel(self, name: str, *args: int) -> None:
        op_name, _, overload = name.partition(".")
        key = P.Operator(op_name, overload)
        if key not in self.operators:
            self.operators.append(key)
        self.instructions.append(P.Instruction(P.KernelCall(self.operators.index(key), list(args))))

    def delegate_call(self, index: int, *args: int) -> None:
        self.instructions.append(P.Instruction(P.DelegateCall(index, list(args))))

    def move(self, src: int, dst: int) -> None:
        self.instructions.append(P.Instruction(P.MoveCall(src, dst)))

    def jump_false(self, cond: int, dest: int) -> None:
        self.instructions.append(P.Instruction(P.JumpFalseCall(cond, dest)))

    def free(self, value: int) -> None:
        self.instructions.append(P.Instruction(P.FreeCall(value)))

    def add_delegate(self, backend_id: str, processed_index: int, specs=(),
                     location: P.DataLocation = P.DataLocation.INLINE) -> int:
        self.delegates.append(P.BackendDelegate(
            id=backend_id, processed=P.BackendDelegateDataReference(location, processed_index),
            compile_specs=[P.CompileSpec(k, v) for k, v in specs]))
        return len(self.delegates) - 1

    def plan(self, inputs: list[int], outputs: list[int]) -> P.ExecutionPlan:
        return P.ExecutionPlan(
            name=self.name, values=self.values, inputs=list(inputs), outputs=list(outputs),
            chains=[P.Chain(inputs=list(inputs), outputs=list(outputs), instructions=self.instructions)],
            operators=self.operators, delegates=self.delegates, non_const_buffer_sizes=[0, max(self.arena, ALIGN)])


class ProgramBuilder:
    """Collects constants (one constant segment) and inline delegate data for several plans."""

    def __init__(self, inline_constants: bool = False):
        self.constants: list[bytes] = [b""]  # buffer 0 means "no data"
        self.mutable: list[bytes] = [b""]  # initial states of mutable buffers (mutable data segment 0)
        self.inline: list[bytes] = []
        self.extra_segments: list[bytes] = []  # program.segments 1.. (0 holds the constants)
        self.inline_constants = inline_constants  # older files: Program.constant_buffer, no segment

    def add_segment(self, data: bytes) -> int:
        self.extra_segments.append(bytes(data))
        return len(self.extra_segments)

    def add_mutable_initial(self, t: torch.Tensor) -> int:
        self.mutable.append(t.contiguous().numpy().tobytes())
        return len(self.mutable) - 1

    def add_constant(self, t: torch.Tensor) -> int:
        self.constants.append(t.numpy().tobytes() if t.dtype != torch.bool else t.to(torch.uint8).numpy().tobytes())
        return len(self.constants) - 1

    def add_inline(self, data: bytes) -> int:
        self.inline.append(bytes(data))
        return len(self.inline) - 1

    def serialize(self, plans: list[P.ExecutionPlan]) -> bytes:
        constants, offsets = _pack(self.constants)
        segments = [constants, *self.extra_segments]
        mutable = None
        if len(self.mutable) > 1:
            blob, mutable_offsets = _pack(self.mutable)
            mutable = [P.SubsegmentOffsets(segment_index=len(segments), offsets=mutable_offsets)]
            segments.append(blob)
        program = P.Program(
            version=0, execution_plan=plans, constant_buffer=[],
            backend_delegate_data=[P.BackendDelegateInlineData(d) for d in self.inline],
            constant_segment=P.SubsegmentOffsets(segment_index=0, offsets=offsets), mutable_data_segments=mutable)
        if self.inline_constants:
            program.constant_buffer = [P.Buffer(storage=c) for c in self.constants]
            program.constant_segment = P.SubsegmentOffsets(segment_index=0, offsets=[])
        return serialize_pte(program, segments)


def _pack(buffers: list[bytes]) -> tuple[bytes, list[int]]:
    blob, offsets = bytearray(), []
    for data in buffers:
        blob.extend(b"\0" * (-len(blob) % ALIGN))
        offsets.append(len(blob))
        blob.extend(data)
    return bytes(blob) or b"\0", offsets


def add_chain(n: int = 3, shape=(2, 3), seed: int = 0, inline_constants: bool = False) -> tuple[bytes, torch.Tensor]:
    """forward(x) = x + w + w + ... (n adds of a constant w); returns (pte bytes, w)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(shape, generator=g)
    prog = ProgramBuilder(inline_constants)
    b = PlanBuilder()
    x = b.tensor(shape)
    wv = b.tensor(shape, data=w, program=prog)
    alpha = b.int(1)
    cur = x
    for _ in range(n):
        out = b.tensor(shape)
        b.kernel("aten::add.out", cur, wv, alpha, out, out)
        cur = out
    return prog.serialize([b.plan([x], [cur])]), w


def branch_program() -> bytes:
    """forward(x, c) = x + x if c else x * x, with JumpFalseCall and MoveCall like torch.cond emits."""
    b = PlanBuilder()
    x = b.tensor([3])
    c = b.tensor([], torch.bool)
    out = b.tensor([3])
    a, m = b.tensor([3]), b.tensor([3])
    always_false = b.bool(False)
    b.jump_false(c, 4)                          # 0
    b.kernel("aten::add.out", x, x, b.int(1), a, a)  # 1
    b.move(a, out)                              # 2
    b.jump_false(always_false, 6)               # 3
    b.kernel("aten::mul.out", x, x, m, m)       # 4
    b.move(m, out)                              # 5
    return ProgramBuilder().serialize([b.plan([x, c], [out])])


def accumulator_program(initial: torch.Tensor | None) -> bytes:
    """forward(x): buf += x; return buf (buf is a mutable buffer, optionally with an initial state)."""
    prog = ProgramBuilder()
    b = PlanBuilder()
    buf = b.tensor([3], program=prog, initial=initial)
    x = b.tensor([3])
    tmp = b.tensor([3])
    b.kernel("aten::add.out", buf, x, b.int(1), tmp, tmp)
    b.kernel("aten::copy_", buf, tmp, b.bool(False), buf)
    return prog.serialize([b.plan([x], [tmp])])


def dynamic_view_program() -> bytes:
    """forward(x: <=[8, 4]) = relu(x.view(x.size(0) * 4)), through sym_size, executorch_prim::mul and et_view."""
    b = PlanBuilder()
    x = b.tensor([8, 4], dynamic=True)
    n, m = b.int(0), b.int(0)
    b.kernel("aten::sym_size.int", x, b.int(0), n)
    b.kernel("executorch_prim::mul.Scalar", n, b.int(4), m)
    flat = b.tensor([32], dynamic=True, planned=False)
    b.kernel("executorch_prim::et_view.default", x, b.int_list([("v", m)]), flat)
    out = b.tensor([32], dynamic=True)
    b.kernel("aten::relu.out", flat, out, out)
    return ProgramBuilder().serialize([b.plan([x], [out])])


class ScaleBackend:
    """Multiplies its input by the factor in its processed bytes; reports delegate events."""

    def __init__(self, available: bool = True):
        self.available = available
        self.inits: list = []
        self.destroyed: list = []
        self.contexts: list = []

    def is_available(self) -> bool:
        return self.available

    def init(self, processed, compile_specs):
        self.inits.append((bytes(processed), list(compile_specs)))
        return {"factor": processed[0]}

    def execute(self, handle, args, context):
        self.contexts.append(context)
        x, out = args
        token = context.start_profiling_delegate(name="scale_op")
        torch.mul(x, handle["factor"], out=out)
        context.end_profiling_delegate(token, b"meta-bytes")
        context.log_profiling_delegate(None, 7, 1000, 2000, b"posthoc")
        context.log_output_delegate(None, 7, out)

    def destroy(self, handle):
        self.destroyed.append(handle)


def delegate_program(backend_id: str = "ScaleBackend", factor: int = 3, in_segment: bool = False) -> bytes:
    prog = ProgramBuilder()
    b = PlanBuilder()
    x = b.tensor([2, 2])
    out = b.tensor([2, 2])
    if in_segment:
        b.add_delegate(backend_id, prog.add_segment(bytes([factor])), [("mode", b"fast")], P.DataLocation.SEGMENT)
    else:
        b.add_delegate(backend_id, prog.add_inline(bytes([factor])), [("mode", b"fast")])
    b.delegate_call(0, x, out)
    return prog.serialize([b.plan([x], [out])])
