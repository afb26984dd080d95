"""Synthetic ETDumps shaped like real runtime output, for tests and benchmarks.

`synthetic_etdump(runs, ops)` gives one "Default" load block and `runs` "Execute" blocks of
`ops` operators each: per operator a kernel event ("native_call_<op>") inside an OPERATOR_CALL,
optionally a debug event with the operator's output tensor, and optionally a delegate call with
backend events carrying int ids, string ids and metadata bytes. Timings are deterministic.
"""

from __future__ import annotations

from etlab.schema import etdump as s

_OPS = ("addmm.out", "relu.out", "permute_copy.out", "convolution.out", "add.out")


def _profile(name, chain, instr, start, dur, did=-1, dids=None, meta=None) -> s.Event:
    return s.Event(profile_event=s.ProfileEvent(
        name=name, chain_index=chain, instruction_id=instr, delegate_debug_id_int=did, delegate_debug_id_str=dids,
        delegate_debug_metadata=meta, start_time=start, end_time=start + dur))


def synthetic_etdump(runs: int, ops: int, *, debug_tensors: bool = False, delegate: bool = False,
                     allocations: bool = False, tensor_numel: int = 16) -> s.ETDump:
    """An ETDump of `runs` executions of an `ops`-operator method (times in ns).

    With debug_tensors, each operator logs a float tensor of `tensor_numel` elements at byte
    offset 64 * (op index) * ... in a debug buffer laid out by `synthetic_debug_buffer`.
    """
    load = s.RunData(name="Default", events=[
        _profile(s.LOAD_METHOD, -1, 0, 1000, 500),
        _profile(s.METHOD_INIT, -1, 0, 1100, 300),
    ])
    if allocations:
        load.allocators = [s.Allocator(name="method_allocator"), s.Allocator(name="temp")]
        load.events += [s.Event(allocation_event=s.AllocationEvent(allocator_id=i % 2, allocation_size=64 * (i + 1)))
                        for i in range(3)]
    blocks = [load]
    t = 10_000
    for r in range(runs):
        events = []
        run_start = t
        for i in range(ops):
            op = _OPS[i % len(_OPS)]
            if debug_tensors:
                events.append(s.Event(debug_event=s.DebugEvent(
                    chain_index=0, instruction_id=i, debug_entry=s.Value(
                        val=s.ValueType.Tensor, tensor=s.Tensor(
                            scalar_type=s.ScalarType.FLOAT, sizes=[tensor_numel], strides=[1],
                            offset=tensor_offset(r, i, ops, tensor_numel))))))
            dur = 1000 + 37 * i + 11 * r
            events.append(_profile(s.kernel_event_name(op), 0, i, t + 50, dur))
            events.append(_profile(s.OPERATOR_CALL, 0, i, t, dur + 100))
            t += dur + 200
        if delegate:
            i = ops
            call_start = t
            events.append(_profile("delegate_setup", 0, i, t + 10, 40, did=0, meta=b"\x01\x02"))
            events.append(_profile("delegate_op", 0, i, t + 60, 300 + r, dids="conv_0", meta=b"conv-meta"))
            events.append(_profile(s.DELEGATE_CALL, 0, i, call_start, 500))
            t += 600
        events.append(_profile(s.METHOD_EXECUTE, -1, 0, run_start, t - run_start))
        if debug_tensors:
            events.append(s.Event(debug_event=s.DebugEvent(
                chain_index=(1 << 64) - 1, instruction_id=0, debug_entry=s.Value(
                    val=s.ValueType.Tensor, output=s.Bool(True), tensor=s.Tensor(
                        scalar_type=s.ScalarType.FLOAT, sizes=[tensor_numel], strides=[1],
                        offset=tensor_offset(r, ops, ops, tensor_numel))))))
        blocks.append(s.RunData(name="Execute", events=events))
        t += 1000
    return s.ETDump(version=0, run_data=blocks)


def tensor_offset(run: int, op: int, ops: int, numel: int) -> int:
    """Byte offset of operator `op`'s output in run `run` (op == ops: the method output)."""
    slot = (numel * 4 + 63) // 64 * 64
    return (run * (ops + 1) + op) * slot


def synthetic_debug_buffer(runs: int, ops: int, numel: int = 16) -> bytes:
    """The debug buffer for `synthetic_etdump(..., debug_tensors=True)`: operator i of run r
    wrote float32 values r * 1000 + i * 10 + arange(numel)."""
    import numpy as np

    slot = (numel * 4 + 63) // 64 * 64
    buf = bytearray(runs * (ops + 1) * slot)
    for r in range(runs):
        for i in range(ops + 1):
            vals = (r * 1000 + i * 10 + np.arange(numel)).astype("<f4")
            off = tensor_offset(r, i, ops, numel)
            buf[off : off + 4 * numel] = vals.tobytes()
    return bytes(buf)
