"""Columns -> `etlab.schema.etdump` dataclasses: the bridge that lets tests compare the fast reader
with the generic verified decoder, field for field."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from etlab.schema import etdump as s

if TYPE_CHECKING:
    from etlab.etdump._reader import ETDumpColumns, TensorColumns, ValueColumns


def _tensor(t: TensorColumns, i: int) -> s.Tensor:
    return s.Tensor(
        scalar_type=s.ScalarType(int(t.scalar_type[i])),
        sizes=t.shape(i) if t.has_sizes[i] else None,
        strides=t.stride(i) if t.has_strides[i] else None,
        offset=int(t.offset[i]),
    )


def _value(v: ValueColumns, j: int) -> s.Value | None:
    if not v.present[j]:
        return None
    x = v.scalar[j]
    has = {k: bool(m[j]) for k, m in v.scalar_tables.items()}
    tl = v.tensor_list[j]
    return s.Value(
        val=s.ValueType(int(v.val[j])),
        tensor=_tensor(v.tensors, int(v.tensor[j])) if v.tensor[j] >= 0 else None,
        tensor_list=None if not v.has_tensor_list[j] else s.TensorList(
            tensors=None if tl is None else [_tensor(v.tensors, i) for i in tl]),
        int_value=s.Int(x) if has["int_value"] else None,
        float_value=s.Float(x) if has["float_value"] else None,
        double_value=s.Double(x) if has["double_value"] else None,
        bool_value=s.Bool(x) if has["bool_value"] else None,
        output=s.Bool(bool(v.is_output[j])) if v.has_output[j] else None,
    )


def columns_to_model(c: ETDumpColumns) -> s.ETDump:
    """The schema dataclasses (etlab.schema.etdump.ETDump) of a columnar read: what writers and round-trip checks
    use."""
    debug_row = np.full(len(c), -1, dtype=np.int64)
    debug_row[c.has_debug] = np.arange(int(c.has_debug.sum()))
    runs = []
    for r in c.runs:
        events = []
        for i in range(r.first_event, r.first_event + r.num_events):
            ev = s.Event()
            name, did_str = c.string(int(c.name_code[i])), c.string(int(c.delegate_id_str_code[i]))
            if c.has_profile[i]:
                ev.profile_event = s.ProfileEvent(
                    name=name, chain_index=int(c.chain_index[i]), instruction_id=int(c.instruction_id[i]),
                    delegate_debug_id_int=int(c.delegate_id_int[i]), delegate_debug_id_str=did_str,
                    delegate_debug_metadata=c.metadata(i), start_time=int(c.start_time[i]),
                    end_time=int(c.end_time[i]),
                )
            if c.has_debug[i] and not c.has_profile[i]:
                ev.debug_event = s.DebugEvent(
                    chain_index=int(c.chain_index[i]) % (1 << 64), instruction_id=int(c.instruction_id[i]),
                    debug_entry=_value(c.values, int(debug_row[i])),
                    delegate_debug_id_int=int(c.delegate_id_int[i]), delegate_debug_id_str=did_str, name=name,
                )
            if c.has_allocation[i]:
                ev.allocation_event = s.AllocationEvent(allocator_id=int(c.allocator_id[i]),
                                                        allocation_size=int(c.allocation_size[i]))
            events.append(ev)
        runs.append(s.RunData(
            name=r.name, bundled_input_index=r.bundled_input_index,
            allocators=None if r.allocator_names is None else [s.Allocator(n) for n in r.allocator_names],
            events=events if r.has_events else None, threads=r.threads,
        ))
    return s.ETDump(version=c.version, run_data=runs if c.has_run_data else None, debug_buffer=c.debug_buffer_digest)
