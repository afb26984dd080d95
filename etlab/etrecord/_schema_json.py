"""torch.export's JSON document -> its schema dataclasses, fast.

`torch._export.serde.serialize.deserialize` turns the JSON into `torch._export.serde.schema`
dataclasses with `typing.get_type_hints` evaluated again for every object (some 16,000 calls for
MobileNetV2's two programs: over a second of the `.etrecord` viewer's time). This is the same
conversion with each class's field types resolved once: same rules (unknown keys ignored, a
`_Union` is a one-key object, floats coerced), same results. The program is then rebuilt by torch's
own `ExportedProgramDeserializer`, exactly as `serde.deserialize` does after its conversion.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Annotated, Any

import torch
from torch._export.serde import schema
from torch._export.serde import serialize as serde
from torch._export.serde.union import _Union, _UnionTag
from torch._export.verifier import load_verifier
from torch._subclasses.fake_tensor import FakeTensor
from torch.export import ExportedProgram
from torch.fx.experimental import symbolic_shapes
from torch.utils._sympy.numbers import int_oo


def _resolve(cls):
    """A schema class named by a string or a forward reference, as torch's converter resolves it."""
    if isinstance(cls, typing.ForwardRef):
        cls = cls.__forward_arg__
    if isinstance(cls, str):
        resolved = getattr(schema, cls, None)
        if resolved is None:
            raise ValueError(f"torch.export schema has no type {cls!r}")
        return resolved
    return cls


@functools.cache
def _plan(cls) -> tuple[str, Any]:
    """How values of type `cls` are converted: (kind, what that kind needs), computed once per type."""
    cls = _resolve(cls)
    origin = typing.get_origin(cls)
    if origin is Annotated:
        return _plan(cls.__origin__)
    if origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(cls):
        args = typing.get_args(cls)
        if len(args) != 2:
            raise ValueError(f"torch.export schema: optional type {cls} has {len(args)} arguments")
        return "optional", args[0]
    if isinstance(cls, type) and issubclass(cls, _Union):
        names = [f.name for f in dataclasses.fields(cls)]
        if {"type", "_type", "create", "value"} & set(names):  # what _Union.__post_init__ checks per object
            raise ValueError(f"torch.export schema: union {cls.__name__} uses a reserved field name")
        return "union", (cls, typing.get_type_hints(cls, globalns=vars(schema)), dict.fromkeys(names))
    if dataclasses.is_dataclass(cls):
        hints = typing.get_type_hints(cls, globalns=vars(schema))
        return "dataclass", (cls, tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls)))
    args = typing.get_args(cls)
    if origin in (list, typing.List):  # noqa: UP006 (the schema spells some as typing.List)
        return "list", args[0] if args else Any
    if origin in (dict, typing.Dict):  # noqa: UP006
        return "dict", args[1] if len(args) > 1 else Any
    if cls is float:
        return "float", None
    return "plain", None


def from_json(cls, data):
    """`data` (parsed JSON) as an instance of the schema type `cls`."""
    kind, how = _plan(cls)
    if kind == "optional":
        return None if data is None else from_json(how, data)
    if kind == "union":
        union, hints, unset = how
        if not isinstance(data, dict) or len(data) != 1:
            raise ValueError(f"torch.export schema: a {union.__name__} must be an object with one key")
        (key, value), = data.items()
        if key not in hints:
            raise ValueError(f"torch.export schema: {union.__name__} has no member {str(key)[:80]!r}")
        # what `union.create(key=value)` builds, without its two dataclasses.fields() walks per object
        # (a third of a large program's rebuild): every member None but `key`, and the tag
        obj = union.__new__(union)
        obj.__dict__.update(unset)
        obj.__dict__[key] = from_json(hints[key], value)
        obj.__dict__["_type"] = _UnionTag.create(key, union)
        return obj
    if kind == "dataclass":
        dc, fields = how
        if not isinstance(data, dict):
            raise ValueError(f"torch.export schema: a {dc.__name__} must be an object")
        return dc(**{name: from_json(t, data[name]) for name, t in fields if name in data})
    if isinstance(data, list):
        return [from_json(how, d) for d in data] if data and kind == "list" else data
    if isinstance(data, dict) and kind == "dict":
        return {k: from_json(how, v) for k, v in data.items()}
    if kind == "float":
        return float(data)
    return data


def _static_tensor_meta(deserializer, meta: schema.TensorMeta) -> FakeTensor:
    """torch's `deserialize_tensor_meta` for a tensor of static sizes and strides: the FakeTensor of a
    meta tensor, built directly instead of through FakeTensorMode's dispatch of `empty_strided` (a
    quarter of a large program's rebuild); symbolic sizes take torch's own path."""
    sizes = [s.as_int if s.type == "as_int" else None for s in meta.sizes]
    strides = [s.as_int if s.type == "as_int" else None for s in meta.strides]
    if None in sizes or None in strides:
        return serde.GraphModuleDeserializer.deserialize_tensor_meta(deserializer, meta)
    elem = torch.empty_strided(sizes, strides, dtype=serde._SERIALIZE_TO_TORCH_DTYPE[meta.dtype], device="meta",
                               requires_grad=meta.requires_grad)
    return FakeTensor(deserializer.fake_tensor_mode, elem, serde.deserialize_device(meta.device))


def deserialize_program(doc: dict, state_dict: dict, constants: dict, example_inputs):
    """The ExportedProgram of a (sanitized) torch.export JSON document, as `serde.deserialize` builds it
    (`ExportedProgramDeserializer.deserialize`'s steps, with the graph deserializer's tensor metadata
    built by `_static_tensor_meta`; torch's classes are final, so the instance gets the method)."""
    program = from_json(schema.ExportedProgram, doc)
    version = program.schema_version
    if version.major != serde.SCHEMA_VERSION[0] and not (version.major == 0 and version.minor == 0):
        raise ValueError(f"torch.export schema version {version.major}.{version.minor} is not this torch's "
                         f"{serde.SCHEMA_VERSION[0]}.{serde.SCHEMA_VERSION[1]}")
    ranges = {k: symbolic_shapes.ValueRanges(serde._int_to_sympy_int(v.min_val, -int_oo),
                                             serde._int_to_sympy_int(v.max_val, int_oo))
              for k, v in program.range_constraints.items()}
    graph_deserializer = serde.GraphModuleDeserializer()
    graph_deserializer.deserialize_tensor_meta = types.MethodType(_static_tensor_meta, graph_deserializer)
    res = graph_deserializer.deserialize(program.graph_module, state_dict, constants, example_inputs, ranges)
    range_constraints = serde.ExportedProgramDeserializer(None).deserialize_range_constraints(ranges,
                                                                                              res.names_to_symbols)
    result = ExportedProgram(root=res.graph_module, graph=res.graph_module.graph, graph_signature=res.signature,
                             state_dict=res.state_dict, range_constraints=range_constraints,
                             module_call_graph=res.module_call_graph, example_inputs=res.example_inputs,
                             constants=res.constants, verifiers=[load_verifier(v) for v in program.verifiers])
    result._guards_code = program.guards_code
    return result
