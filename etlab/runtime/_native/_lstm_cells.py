"""Edge's decomposed LSTM cells found in a native plan at load, each then computed as one native step (`lstm.cpp`).

An LSTM lowered by Edge runs every time step as twelve instructions:

    G1 = addmm(b_hh, h, W_hh^T)   (or mm(h, W_hh^T) without a bias)
    G  = add(G1, x_t)             (x_t: the time step's input projection, computed for all steps at once)
    i, f, g, o = split_with_sizes_copy(G, [H, H, H, H], dim=-1)
    i, f, g, o = sigmoid(i), sigmoid(f), tanh(g), sigmoid(o)
    c' = add(mul(f, c), mul(i, g));  h' = mul(o, tanh(c'))

Through the core that is twelve steps on a few hundred floats each; eager PyTorch runs oneDNN's fused LSTM. A
cell is fused only when it is exactly this (the operators in this order, float32, static shapes, one batch of B
rows of hidden size H in every value, the elementwise operands in either order) and when nothing outside the cell
reads any of its 13 intermediate values (G1, G, the gates before and after their activations, f * c, i * g,
tanh(c')): the fused step writes only c' and h'. "Reads" is decided on memory, as the plan lays it out (aliases
of a value, such as the reshape of G1 the add reads, share its bytes; values that died share bytes with later
ones): walking the steps outside the cell in run order from its end (the program's outputs after the last step,
then the next run's inputs and steps up to the cell), no step may read a byte of an intermediate before that byte
is written again (by the cell's own c' and h', or by a later step). Operators whose writes the runtime cannot tell
from a schema count as reading every tensor they touch; in a chain with jumps any read counts.

The instructions keep their own steps: a timed or traced run (ETDump profiling, logged values, memory events)
runs them one by one, so each instruction's events are its own kernel's, as the XNNPACK delegate's native loop
keeps one timed step per node. Only untraced runs compute the cell at once, and the core falls back to the steps
whenever a captured tensor changed or a dispatch mode or profiler watches the run. A method loaded to log
intermediate outputs is never fused (`build_native_core`), and the Python core (`_interpreter`) never fuses:
it stays the reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from etlab.runtime._values import OPT_TENSOR_LIST, TENSOR, TENSOR_LIST, ValueTable
from etlab.schema import program as P

CELL = ("aten::addmm.out|aten::mm.out", "aten::add.out", "aten::split_with_sizes_copy.out", "aten::sigmoid.out",
        "aten::sigmoid.out", "aten::tanh.out", "aten::sigmoid.out", "aten::mul.out", "aten::mul.out",
        "aten::add.out", "aten::tanh.out", "aten::mul.out")
MAX_ROWS = 8  # batch rows: the fused product streams the weight once per row (ATen's GEMM beyond)


@dataclass
class Cell:
    """One matched cell: where it starts in its chain and the tensors the fused step reads and writes."""

    chain: int
    start: int
    bias: torch.Tensor | None
    h: torch.Tensor
    w: torch.Tensor
    x: torch.Tensor
    c: torch.Tensor
    c_out: torch.Tensor
    h_out: torch.Tensor
    intermediates: list[torch.Tensor]


def _span(t: torch.Tensor) -> tuple[int, int] | None:
    """The bytes [lo, hi) a tensor's elements lie in (None: no elements)."""
    if t.numel() == 0:
        return None
    lo = t.data_ptr()
    if any(s < 0 for s in t.stride()):
        return lo - t.numel() * 64 * t.element_size(), lo + t.numel() * 64 * t.element_size()  # never: be wide
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return lo, lo + (last + 1) * t.element_size()


def _squeezed(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(n for n in t.shape if n != 1)


def _dense(t, shape: tuple[int, ...]) -> bool:
    """A contiguous float32 CPU tensor of `shape` up to unit dimensions."""
    return (isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.device.type == "cpu"
            and t.layout == torch.strided and t.is_contiguous() and _squeezed(t) == tuple(n for n in shape if n != 1))


def _same(a, b) -> bool:
    """The same value in memory: the same bytes, element for element (a value and its planned alias)."""
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.numel() == b.numel() > 0
            and a.is_contiguous() and b.is_contiguous() and a.dtype == b.dtype and a.data_ptr() == b.data_ptr())


def _is_one(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and v == 1


def _pick(pair, known, same=None) -> object | None:
    """The other operand of a commutative pair when exactly one of them is `known` (the same value: the same
    object, or with `same`, its test), else None."""
    same = same or (lambda x, y: x is y)
    a, b = pair
    if same(a, known) and not same(b, known):
        return b
    if same(b, known) and not same(a, known):
        return a
    return None


def _match(names: list[str], v: list[list], chain: int, start: int) -> Cell | None:
    """The cell of the twelve instructions at `start` (`names`: their operators, `v`: their argument values).
    A value read is the one an earlier step wrote when it is the same tensor object (the value table's), except
    G1, which the add reads through its planned reshape (the same bytes, written by the step just before). The
    plan may give a value the bytes of one that died earlier in the cell (c's to i * g, i's to sigmoid(o)):
    identities are never decided on memory beyond that."""
    if names[0] not in CELL[0].split("|") or list(names[1:]) != list(CELL[1:]):
        return None
    if names[0] == "aten::addmm.out":
        bias, h, w, beta, alpha, g1 = v[0][:6]
        if not (_is_one(beta) and _is_one(alpha)):
            return None
    else:
        bias, (h, w, g1) = None, v[0][:3]
    if not (isinstance(h, torch.Tensor) and isinstance(w, torch.Tensor) and h.dim() == 2 and w.dim() == 2):
        return None
    rows, k = h.shape
    n = w.shape[1]
    hidden = n // 4
    if not (1 <= rows <= MAX_ROWS and w.shape[0] == k and n % 4 == 0 and hidden > 0 and w.dtype == torch.float32
            and _dense(h, (rows, k)) and _dense(g1, (rows, n))):
        return None
    if bias is not None and not _dense(bias, (n,)):
        return None
    a, b, alpha, g = v[1][:4]
    x = _pick((a, b), g1, _same)
    if x is None or not _is_one(alpha) or not _dense(x, (rows, n)) or not _dense(g, (rows, n)):
        return None
    src, sizes, dim, gates = v[2][:4]
    if not (src is g and list(sizes) == [hidden] * 4 and dim in (-1, g.dim() - 1) and g.shape[-1] == n
            and isinstance(gates, list) and len(gates) == 4 and all(_dense(t, (rows, hidden)) for t in gates)):
        return None
    acts = []
    for q in range(4):  # sigmoid(i), sigmoid(f), tanh(g), sigmoid(o)
        src, out = v[3 + q][:2]
        if not (src is gates[q] and _dense(out, (rows, hidden))):
            return None
        acts.append(out)
    si, sf, tg, so = acts
    c, fc = _pick(v[7][:2], sf), v[7][2]
    ig = v[8][2]
    alpha, c_out = v[9][2], v[9][3]
    tc_src, tc = v[10][:2]
    h_out = v[11][2]
    values = [g1, g, *gates, *acts, fc, ig, c_out, tc, h_out]
    if c is None or not all(_dense(t, (rows, hidden)) for t in (c, fc, ig, c_out, tc, h_out)) or not _is_one(alpha):
        return None
    if (_pick(v[8][:2], si) is not tg or _pick(v[9][:2], fc) is not ig or tc_src is not c_out
            or _pick(v[11][:2], so) is not tc or len({id(t) for t in values}) != len(values)):
        return None
    if any(t is u for t in (c, x, h) for u in values):
        return None
    return Cell(chain, start, bias, h, w, x, c, c_out, h_out, [g1, g, *gates, *acts, fc, ig, tc])


class _Accesses:
    """Every step's reads and writes as byte ranges, in run order: chain by chain, then the program's outputs
    (read by the caller), then its inputs (written by the caller before the next run)."""

    def __init__(self, plan: P.ExecutionPlan, table: ValueTable, chains, kernels: dict):
        reads: list[tuple[int, int, int]] = []
        writes: list[tuple[int, int, int]] = []
        self.position: dict[tuple[int, int], int] = {}
        pos = 0
        for c, (chain, bound) in enumerate(zip(plan.chains or [], chains)):
            for i, (instr, info) in enumerate(zip(chain.instructions or [], bound.infos)):
                self.position[c, i] = pos
                r, w = _instruction_accesses(instr.instr_args, info, table, kernels)
                reads += [(pos, *s) for s in r]
                writes += [(pos, *s) for s in w]
                pos += 1
        reads += [(pos, *s) for slot in plan.outputs or [] for s in _slot_spans(table, slot)]
        writes += [(pos + 1, *s) for slot in plan.inputs or [] for s in _slot_spans(table, slot)]
        self.cycle = pos + 2
        self.reads = np.array(reads or [(0, 0, 0)], dtype=np.int64).reshape(-1, 3)
        self.writes = np.array(writes or [(0, 0, 0)], dtype=np.int64).reshape(-1, 3)
        if not reads:
            self.reads = self.reads[:0]
        if not writes:
            self.writes = self.writes[:0]
        self.jumps = any(bound.jumps for bound in chains)

    def unread(self, chain: int, start: int, span: int, t: torch.Tensor, written: list[torch.Tensor]) -> bool:
        """Nothing outside steps [start, start + span) of `chain` reads bytes of `t` before they are overwritten, or
        before the cell's fused step itself writes them (`written`: its outputs)."""
        lo_hi = _span(t)
        if lo_hi is None:
            return True
        lo, hi = lo_hi
        uncovered = [(lo, hi)]
        for out in written:
            if (s := _span(out)) is not None:
                uncovered = _subtract(uncovered, s)
        first, end = self.position[chain, start], self.position[chain, start + span - 1] + 1
        r, w = self.reads, self.writes
        r = r[(r[:, 1] < hi) & (r[:, 2] > lo) & ((r[:, 0] < first) | (r[:, 0] >= end))]
        if not uncovered or len(r) == 0:
            return True
        if self.jumps:  # a jump may skip the write that would end the value: any read counts
            return False
        w = w[(w[:, 1] < hi) & (w[:, 2] > lo) & ((w[:, 0] < first) | (w[:, 0] >= end))]
        # in run order from the cell's end (a step's reads before its writes)
        events = sorted([((p - end) % self.cycle, 0, a, b) for p, a, b in r.tolist()]
                        + [((p - end) % self.cycle, 1, a, b) for p, a, b in w.tolist()])
        for _, kind, a, b in events:
            if kind == 0:
                if any(a < y and x < b for x, y in uncovered):
                    return False
            else:
                uncovered = _subtract(uncovered, (a, b))
                if not uncovered:
                    return True
        return True


def _subtract(ranges: list[tuple[int, int]], cut: tuple[int, int]) -> list[tuple[int, int]]:
    """Byte ranges minus one range."""
    a, b = cut
    out = []
    for x, y in ranges:
        if b <= x or y <= a:
            out.append((x, y))
            continue
        if x < a:
            out.append((x, a))
        if b < y:
            out.append((b, y))
    return out


def _slot_tensors(table: ValueTable, slot: int) -> list[torch.Tensor]:
    kind = table.kinds[slot]
    value = table.values[slot]
    if kind == TENSOR and isinstance(value, torch.Tensor):
        return [value]
    if kind in (TENSOR_LIST, OPT_TENSOR_LIST) and isinstance(value, list):
        return [t for t in value if isinstance(t, torch.Tensor)]
    return []


def _slot_spans(table: ValueTable, slot: int) -> list[tuple[int, int]]:
    return [s for t in _slot_tensors(table, slot) if (s := _span(t)) is not None]


def _instruction_accesses(args, info, table: ValueTable, kernels: dict):
    """(byte ranges read, byte ranges written) of one instruction; when unsure, a read."""
    if isinstance(args, P.KernelCall):
        slots = list(args.args or [])
        entry = kernels.get(info.operator)
        schema = None
        if entry is not None and entry.origin == "torch":
            from etlab.runtime._torch_kernels import _resolve

            schema = getattr(_resolve(entry.name), "_schema", None)
        if schema is None or len(slots) < len(schema.arguments):
            return [s for slot in slots for s in _slot_spans(table, slot)], []
        reads, writes = [], []
        for a, slot in zip(schema.arguments, slots):
            spans = _slot_spans(table, slot)
            written = a.alias_info is not None and a.alias_info.is_write
            if written:
                writes += spans
            if not written or not a.kwarg_only:  # an in-place argument is read too
                reads += spans
        return reads, writes
    if isinstance(args, P.DelegateCall):
        return [s for slot in args.args or [] for s in _slot_spans(table, slot)], []
    if isinstance(args, P.MoveCall):
        return _slot_spans(table, args.move_from) + _slot_spans(table, args.move_to), []
    if isinstance(args, P.JumpFalseCall):
        return _slot_spans(table, args.cond_value_index), []
    if isinstance(args, P.FreeCall):
        return _slot_spans(table, args.value_index), []
    return [], []


def find_cells(plan: P.ExecutionPlan, table: ValueTable, chains, kernels: dict) -> list[Cell]:
    """The method's LSTM cells that can be fused (see the module doc), in run order."""
    span = len(CELL)
    cells: list[Cell] = []
    accesses = None
    for c, (chain, bound) in enumerate(zip(plan.chains or [], chains)):
        instructions = chain.instructions or []
        names = []
        for instr, info in zip(instructions, bound.infos):
            entry = kernels.get(info.operator) if isinstance(instr.instr_args, P.KernelCall) else None
            names.append(entry.name if entry is not None and entry.origin == "torch" else "")
        i = 0
        while i + span <= len(instructions):
            if names[i] not in ("aten::addmm.out", "aten::mm.out") or names[i + 1] != CELL[1]:
                i += 1
                continue
            slots = [list(instructions[i + k].instr_args.args or []) for k in range(span)]
            if not all(table.is_static_shape(s) for row in slots for s in row if table.kinds[s] == TENSOR):
                i += 1
                continue
            cell = _match(names[i:i + span], [[table.values[s] for s in row] for row in slots], c, i)
            if cell is not None:
                accesses = accesses or _Accesses(plan, table, chains, kernels)
                if all(accesses.unread(c, i, span, t, [cell.c_out, cell.h_out]) for t in cell.intermediates):
                    cells.append(cell)
                    i += span
                    continue
            i += 1
    return cells


def add_cells(native, plan: P.ExecutionPlan, table: ValueTable, chains, kernels: dict) -> int:
    """Marks each fusable cell in the native plan (its steps already added); returns how many were marked."""
    count = 0
    for cell in find_cells(plan, table, chains, kernels):
        try:
            native.set_lstm_cell(cell.chain, cell.start, len(CELL), cell.bias, cell.h, cell.w, cell.x, cell.c,
                                 cell.c_out, cell.h_out)
        except (ValueError, TypeError, IndexError):
            continue  # a step runs in Python, a CPU without AVX2, a tensor the kernel refuses: the steps run
        count += 1
    return count
