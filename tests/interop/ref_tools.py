"""Upstream-ExecuTorch side of the etlab interop harness.

Run ONLY with the reference python printed by ``shared/reference/setup.sh``
(upstream ExecuTorch 1.5.1).  etlab itself never imports this file or upstream;
tests call it in a subprocess.  It complements ``shared/reference/et_ref.py``.

  REF=$(bash ../shared/reference/setup.sh)
  $REF tests/interop/ref_tools.py dump {pte,bpte,etdp,ptd} PATH --json OUT
  $REF tests/interop/ref_tools.py dump-many KIND PATH OUT [KIND PATH OUT ...]
  $REF tests/interop/ref_tools.py export-external FILE.py:FUNC --out DIR
  $REF tests/interop/ref_tools.py run-with-data PTE PTD --inputs in.pt --outputs out.pt
  $REF tests/interop/ref_tools.py inspect-events ETDP [--etrecord R] [--debug-buffer B] --json OUT

``dump`` parses a file with upstream's own deserializers and writes a canonical
JSON of every field upstream sees (rules in ``canon``), so our own parser can be
compared field by field.  Top-level keys per kind:

  pte : kind, file, file_identifier, extended_header, program, segments, restored
        ("program" is the flatbuffer as stored; "restored" holds the fields that
        deserialize_pte_binary rewrites when it folds segments back in; "segments" is
        one {nbytes, sha256} per Program.segments entry, null if no extended header)
  bpte: kind, file, file_identifier, bundled_program
  etdp: kind, file, size_prefix, file_identifier, etdump
  ptd : kind, file, file_identifier, header, flat_tensor, buffers, named_data

Tensors cross the process boundary as torch.save files holding a list of tensors.
"""

import argparse
import dataclasses
import enum
import hashlib
import importlib.util
import json
import logging
import math
import os
import sys
import time
import typing
import warnings

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)


# --------------------------------------------------------------------------------------
# Canonical JSON
# --------------------------------------------------------------------------------------
#
# Rules (etlab's side produces the same form):
#  * dataclass -> {schema_field_name: value}; values of union-typed fields (a field
#    whose annotation is a Union of >= 2 dataclasses: program EValue.val,
#    Instruction.instr_args, bundled Value.val) additionally carry "_type": class name.
#  * Enum -> int.  bool stays bool.
#  * bytes / bytearray / memoryview, and any field declared ``bytes`` upstream (the
#    [ubyte] vectors: Buffer.storage, BackendDelegateInlineData.data, CompileSpec.value,
#    ProfileEvent.delegate_debug_metadata, bundled Tensor.data, BundledProgram.program)
#    -> {"nbytes": n, "sha256": hex}.  Other [ubyte] vectors that are index lists
#    (Tensor.dim_order, TensorLayout.dim_order) stay lists of ints.
#  * list/tuple -> list; float -> float, with NaN/inf as "nan" / "inf" / "-inf".
#  * None (field absent in the flatbuffer) -> null.
#
# Field names: upstream 1.5.1's python dataclasses (exir/schema.py,
# exir/backend/compile_spec_schema.py, devtools/etdump/schema_flatcc.py,
# devtools/bundled_program/schema/bundled_program_schema.py,
# extension/flat_tensor/serialize/flat_tensor_schema.py, exir/tensor_layout.py) use
# exactly the field names of the .fbs tables (schema/program.fbs,
# devtools/etdump/etdump_schema_flatcc.fbs,
# devtools/bundled_program/schema/bundled_program_schema.fbs,
# extension/flat_tensor/serialize/flat_tensor.fbs) -- checked field by field for 1.5.1,
# so _FIELD_RENAMES is empty.  It stays as the place to map (dataclass name, field)
# -> schema field name should a future upstream diverge.
#
# Type-level differences that ARE normalised here:
#  * etdump Value.val: the .fbs declares `val: ValueType` (a byte enum), but upstream
#    decodes it through flatc JSON into the *string* enum name ("Tensor", ...), typed
#    `str`.  We emit the schema's integer (see _ETDUMP_VALUE_TYPE).
#  * bundled Tensor.dim_order is annotated List[bytes] upstream but holds ints; kept
#    as a list of ints.
#  * program Double.double_val: upstream stores +-inf as the strings "inf"/"-inf"
#    already; they pass through unchanged (same as our float rule).
_FIELD_RENAMES: dict = {}

# etdump_schema_flatcc.fbs: enum ValueType : byte { Null, Int, Bool, Float, Double,
# Tensor, TensorList, String }
_ETDUMP_VALUE_TYPE = {
    n: i for i, n in enumerate(["Null", "Int", "Bool", "Float", "Double", "Tensor", "TensorList", "String"])
}


def digest(b) -> dict:
    if hasattr(b, "to_bytes") and not isinstance(b, (bytes, bytearray, memoryview)):
        b = b.to_bytes()  # exir._serialize._cord.FileBackedData
    b = bytes(b)
    return {"nbytes": len(b), "sha256": hashlib.sha256(b).hexdigest()}


def _canon_float(x: float):
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return float(x)


_HINTS: dict = {}


def _hints(cls) -> dict:
    if cls not in _HINTS:
        try:
            _HINTS[cls] = typing.get_type_hints(cls)
        except Exception:  # pragma: no cover - unresolvable forward refs
            _HINTS[cls] = {f.name: f.type for f in dataclasses.fields(cls)}
    return _HINTS[cls]


def _is_union_field(hint) -> bool:
    if typing.get_origin(hint) is not typing.Union:
        return False
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return len(args) >= 2 and all(dataclasses.is_dataclass(a) for a in args)


def _is_bytes_field(hint) -> bool:
    if typing.get_origin(hint) is typing.Union:  # Optional[bytes]
        return any(a is bytes for a in typing.get_args(hint))
    return hint is bytes


def canon(v, *, union: bool = False, as_bytes: bool = False):
    if v is None:
        return None
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        cls = type(v)
        hints = _hints(cls)
        out = {}
        if union:
            out["_type"] = cls.__name__
        for f in dataclasses.fields(cls):
            name = _FIELD_RENAMES.get((cls.__name__, f.name), f.name)
            hint = hints.get(f.name)
            val = getattr(v, f.name)
            if (
                cls.__module__.endswith("etdump.schema_flatcc")
                and cls.__name__ == "Value"
                and f.name == "val"
                and isinstance(val, str)
            ):
                out[name] = _ETDUMP_VALUE_TYPE[val]
                continue
            out[name] = canon(val, union=_is_union_field(hint), as_bytes=_is_bytes_field(hint))
        return out
    if isinstance(v, (bytes, bytearray, memoryview)):
        return digest(v)
    if as_bytes and isinstance(v, (list, tuple)):
        return digest(bytes(v))
    if isinstance(v, enum.Enum):
        return int(v.value) if isinstance(v.value, int) else v.value
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return _canon_float(v)
    if isinstance(v, str):
        return v
    if isinstance(v, (list, tuple)):
        return [canon(x) for x in v]
    if isinstance(v, dict):
        return {str(k): canon(x) for k, x in v.items()}
    raise TypeError(f"cannot canonicalise {type(v).__name__}: {v!r}")


def _ident(data: bytes, at: int = 4) -> str:
    return data[at : at + 4].decode("latin-1")


# --------------------------------------------------------------------------------------
# dump
# --------------------------------------------------------------------------------------


def dump_pte(data: bytes) -> dict:
    from executorch.exir._serialize._flatbuffer_program import _flatbuffer_to_program
    from executorch.exir._serialize._program import (
        _get_extended_header,
        deserialize_pte_binary,
    )

    eh = _get_extended_header(data)
    program_size = eh.program_size if eh else len(data)
    base = eh.segment_base_offset if eh else 0
    # Raw view: the flatbuffer exactly as stored (this is the first step of
    # deserialize_pte_binary, before it folds segments back into the Program).
    raw = _flatbuffer_to_program(data[:program_size])
    # Raw bytes of each Program.segments entry, located as the runtime does: extended
    # header's segment_base_offset + DataSegment.offset, DataSegment.size bytes.  Without
    # an extended header the segment data cannot be located: entries are null.
    segments = []
    for s in raw.segments or []:
        start = base + s.offset
        segments.append(digest(data[start : start + s.size]) if eh else None)
    # Restored view: what deserialize_pte_binary hands back after moving segment data
    # into constant_buffer / backend_delegate_data / mutable_data / named_data.  Only the
    # fields it changes are reported (everything else equals "program").
    pf = deserialize_pte_binary(data)
    p = pf.program
    named = None
    if pf.named_data is not None:
        named = {}
        for key, entry in pf.named_data.pte_data.items():
            named[key] = dict(
                digest(pf.named_data.buffers[entry.buffer_index]),
                buffer_index=entry.buffer_index,
            )
    restored = {
        "constant_buffer": canon(p.constant_buffer),
        "backend_delegate_data": canon(p.backend_delegate_data),
        "constant_segment": canon(p.constant_segment),
        "segments": canon(p.segments),
        "named_data": canon(p.named_data),
        "mutable_data": canon(pf.mutable_data),
        "named_data_store": named,
    }
    return {
        "kind": "pte",
        "file": digest(data),
        "file_identifier": _ident(data),
        "extended_header": None
        if eh is None
        else {
            "magic": eh.magic.decode("latin-1"),
            "length": eh.length,
            "program_size": eh.program_size,
            "segment_base_offset": eh.segment_base_offset,
            "segment_data_size": eh.segment_data_size,
        },
        "program": canon(raw),
        "segments": segments,
        "restored": restored,
    }


def dump_bpte(data: bytes) -> dict:
    from executorch.devtools.bundled_program.serialize import (
        deserialize_from_flatbuffer_to_bundled_program,
    )

    bp = deserialize_from_flatbuffer_to_bundled_program(data)
    return {
        "kind": "bpte",
        "file": digest(data),
        "file_identifier": _ident(data),
        "bundled_program": canon(bp),
    }


def dump_etdp(data: bytes) -> dict:
    from executorch.devtools.etdump.serialize import deserialize_from_etdump_flatcc

    # The runtime writes a size-prefixed flatbuffer: u32 size, then the buffer whose
    # file_identifier sits at +4 -> absolute bytes 8..12.
    et = deserialize_from_etdump_flatcc(data, size_prefixed=True)
    return {
        "kind": "etdp",
        "file": digest(data),
        "size_prefix": int.from_bytes(data[0:4], "little"),
        "file_identifier": _ident(data, 8),
        "etdump": canon(et),
    }


def dump_ptd(data: bytes) -> dict:
    from executorch.exir._serialize._cord import Cord
    from executorch.extension.flat_tensor.serialize.serialize import (
        FlatTensorHeader,
        FlatTensorSerializer,
        _deserialize_to_flat_tensor,
    )

    h = FlatTensorHeader.from_bytes(data[8:])
    ft = _deserialize_to_flat_tensor(data[: h.flatbuffer_offset + h.flatbuffer_size])
    payload = FlatTensorSerializer().deserialize(Cord(data))
    named = {}
    for key, entry in payload.named_data.items():
        named[key] = dict(
            digest(payload.buffers[entry.buffer_index]),
            buffer_index=entry.buffer_index,
            tensor_layout=canon(entry.tensor_layout),
        )
    return {
        "kind": "ptd",
        "file": digest(data),
        "file_identifier": _ident(data),
        "header": {
            "magic": h.magic.decode("latin-1"),
            "length": h.length,
            "flatbuffer_offset": h.flatbuffer_offset,
            "flatbuffer_size": h.flatbuffer_size,
            "segment_base_offset": h.segment_base_offset,
            "segment_data_size": h.segment_data_size,
        },
        "flat_tensor": canon(ft),
        "buffers": [digest(b) for b in payload.buffers],
        "named_data": named,
    }


_DUMPERS = {"pte": dump_pte, "bpte": dump_bpte, "etdp": dump_etdp, "ptd": dump_ptd}


def _write_json(path: str, obj) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True, allow_nan=False)
    os.replace(tmp, path)


def _dump_one(kind: str, path: str, out_json: str) -> dict:
    with open(path, "rb") as f:
        data = f.read()
    out = _DUMPERS[kind](data)
    _write_json(out_json, out)
    return {"kind": kind, "json": out_json, "keys": sorted(out)}


def cmd_dump(a) -> None:
    print(json.dumps(_dump_one(a.kind, a.path, a.json)))


def cmd_dump_many(a) -> None:
    # Same as repeated `dump`, but pays upstream's ~5-8 s import cost once.
    t = a.triples
    if len(t) % 3:
        raise SystemExit("dump-many takes KIND PATH OUT triples")
    for i in range(0, len(t), 3):
        if t[i] not in _DUMPERS:
            raise SystemExit(f"unknown kind {t[i]!r}; expected one of {sorted(_DUMPERS)}")
    print(json.dumps([_dump_one(*t[i : i + 3]) for i in range(0, len(t), 3)]))


# --------------------------------------------------------------------------------------
# export-external / run-with-data
# --------------------------------------------------------------------------------------


def _factory(spec: str):
    path, fn = spec.rsplit(":", 1)
    mod_spec = importlib.util.spec_from_file_location("_reftools_models", path)
    mod = importlib.util.module_from_spec(mod_spec)
    sys.modules["_reftools_models"] = mod
    mod_spec.loader.exec_module(mod)
    return getattr(mod, fn)()


def _as_list(x):
    return list(x) if isinstance(x, (tuple, list)) else [x]


def cmd_export_external(a) -> None:
    import torch
    from executorch.exir import ExecutorchBackendConfig, to_edge
    from torch.export import export

    model, inputs = _factory(a.factory)
    os.makedirs(a.out, exist_ok=True)
    ep = export(model, tuple(inputs))
    et = to_edge(ep).to_executorch(ExecutorchBackendConfig(external_constants=True))
    with open(os.path.join(a.out, "model.pte"), "wb") as f:
        et.write_to_file(f)
    # Writes "<tag>.ptd" per data file; 1.5.1 tags external_constants=True data as
    # "_default_external_constant".
    et.write_tensor_data_to_file(a.out)
    torch.save(list(inputs), os.path.join(a.out, "inputs.pt"))
    with torch.no_grad():
        ref = model(*inputs)
    torch.save(_as_list(ref), os.path.join(a.out, "eager_outputs.pt"))
    ptds = sorted(n for n in os.listdir(a.out) if n.endswith(".ptd"))
    print(json.dumps({"out": a.out, "ptd": ptds, "pte_bytes": len(et.buffer)}))


def cmd_run_with_data(a) -> None:
    import torch
    from executorch.runtime import Runtime

    # Runtime.load_program(path, data_path=...) -> pybindings _load_program(...,
    # data_path=...), which wraps the .ptd in a FlatTensorDataMap.
    prog = Runtime.get().load_program(a.pte, data_path=a.ptd)
    method = prog.load_method(a.method)
    inputs = torch.load(a.inputs, weights_only=True)
    outs = method.execute(list(inputs))
    torch.save([o for o in outs], a.outputs)
    print(json.dumps({"outputs": len(outs)}))


# --------------------------------------------------------------------------------------
# inspect-events
# --------------------------------------------------------------------------------------


def _describe(v):
    import torch

    if isinstance(v, torch.Tensor):
        t = v.detach().contiguous()
        return {
            "shape": list(t.shape),
            "dtype": str(t.dtype).replace("torch.", ""),
            "sha256": hashlib.sha256(t.numpy().tobytes()).hexdigest(),
        }
    if isinstance(v, (list, tuple)):
        return [_describe(x) for x in v]
    if isinstance(v, float):
        return _canon_float(v)
    if isinstance(v, (bool, int, str)) or v is None:
        return v
    return repr(v)


def _plain(v):
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return _canon_float(v)
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return repr(v)


def cmd_inspect_events(a) -> None:
    from executorch.devtools import Inspector

    t0 = time.perf_counter()
    ins = Inspector(etdump_path=a.etdump, etrecord=a.etrecord, debug_buffer_path=a.debug_buffer)
    blocks = []
    n = 0
    for b in ins.event_blocks:
        events = []
        for e in b.events:
            dd = e.debug_data
            events.append(
                {
                    "name": e.name,
                    "perf_data": None if e.perf_data is None else [_canon_float(float(x)) for x in e.perf_data.raw],
                    "instruction_id": e._instruction_id,
                    "delegate_debug_identifier": _plain(e.delegate_debug_identifier),
                    "debug_handles": _plain(e.debug_handles),
                    "is_delegated_op": e.is_delegated_op,
                    "delegate_backend_name": e.delegate_backend_name,
                    "op_types": _plain(e.op_types),
                    "num_outputs": e.num_outputs,
                    "start_time": _plain(e._start_time),
                    "has_debug_data": bool(dd),
                    "debug_data": _describe(dd) if dd else None,
                }
            )
        n += len(events)
        blocks.append(
            {
                "name": b.name,
                "bundled_input_index": b.bundled_input_index,
                "num_events": len(events),
                "events": events,
            }
        )
    out = {
        "event_count": n,
        "seconds": time.perf_counter() - t0,
        "event_blocks": blocks,
    }
    _write_json(a.json, out)
    print(json.dumps({"event_blocks": len(blocks), "event_count": n}))


# --------------------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump", help="canonical JSON of a file via upstream parsers")
    d.add_argument("kind", choices=sorted(_DUMPERS))
    d.add_argument("path")
    d.add_argument("--json", required=True)
    dm = sub.add_parser("dump-many", help="several dumps in one process")
    dm.add_argument("triples", nargs="+", metavar="KIND PATH OUT")
    e = sub.add_parser("export-external", help="export with constants in a .ptd")
    e.add_argument("factory")
    e.add_argument("--out", required=True)
    r = sub.add_parser("run-with-data", help="run a .pte with an external .ptd")
    r.add_argument("pte")
    r.add_argument("ptd")
    r.add_argument("--inputs", required=True)
    r.add_argument("--outputs", required=True)
    r.add_argument("--method", default="forward")
    i = sub.add_parser("inspect-events", help="Inspector event blocks as JSON")
    i.add_argument("etdump")
    i.add_argument("--etrecord")
    i.add_argument("--debug-buffer")
    i.add_argument("--json", required=True)
    a = p.parse_args()
    {
        "dump": cmd_dump,
        "dump-many": cmd_dump_many,
        "export-external": cmd_export_external,
        "run-with-data": cmd_run_with_data,
        "inspect-events": cmd_inspect_events,
    }[a.cmd](a)


if __name__ == "__main__":
    main()
