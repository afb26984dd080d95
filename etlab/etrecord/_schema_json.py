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

from torch._export.serde import schema
from torch._export.serde import serialize as serde
from torch._export.serde.union import _Union


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
        return "union", (cls, typing.get_type_hints(cls, globalns=vars(schema)))
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
        union, hints = how
        if not isinstance(data, dict) or len(data) != 1:
            raise ValueError(f"torch.export schema: a {union.__name__} must be an object with one key")
        (key, value), = data.items()
        if key not in hints:
            raise ValueError(f"torch.export schema: {union.__name__} has no member {str(key)[:80]!r}")
        return union.create(**{key: from_json(hints[key], value)})
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


def deserialize_program(doc: dict, state_dict: dict, constants: dict, example_inputs):
    """The ExportedProgram of a (sanitized) torch.export JSON document, as `serde.deserialize` builds it."""
    program = from_json(schema.ExportedProgram, doc)
    return serde.ExportedProgramDeserializer(None).deserialize(program, state_dict, constants, example_inputs)
