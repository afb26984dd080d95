"""Faster torch.export JSON serialization while an ETRecord is saved.

torch's serializer builds a `TensorMeta` for every node output and a `SymInt` union for every size,
stride and offset; each union's `create` walks `dataclasses.fields` twice. A Swin-T's two programs
(ATen and Edge) hold ~2,600 tensor values and ~17,000 sizes, and building them was most of the
save (etlab took 2-3x upstream's time). Models repeat a few shapes over and over, so the metadata of
a static-shape tensor is built once per distinct (shape, strides, offset, dtype, device, layout,
requires_grad) and plain ints once per value. Symbolic sizes take torch's own path.

Turning the schema's dataclasses into JSON dicts (`_dataclass_to_dict`) went through each union's
checking `__getattribute__` and `dataclasses.fields` for every object; the same dicts are built here
from per-class field lists, and each shared (memoized) object is converted once.

The memo lives only inside `fast_serialization()`: torch's module functions are swapped for the
memoized ones and restored afterwards (a lock keeps concurrent saves from restoring under each other).
The objects are shared between nodes; the serializer only reads them (it turns them into dicts).

Each union value (`_Union.create`, ~4 per node) built a dict of all its fields' names from
`dataclasses.fields` and re-checked the class's field names in `__post_init__`; inside, the object
is filled from the per-class field list instead (the reserved-name check done once per class).
torch's `serialize_graph` formats the whole graph (`print_readable`) as the argument of a debug log
line, whether or not debug logging is on; inside, on the saving thread and with that logger's debug
level off, that text is not built (nothing would read it).

The cyclic garbage collector is paused inside too: a save allocates hundreds of thousands of small
dicts and lists, none of them cyclic garbage, and each time they crossed the thresholds Python walked
the whole heap (the programs' FX graphs with it): half of a save's CPU time on a MobileViT or a Llama
with a KV cache (0.4-0.8 s instead of 0.25-0.45 s), the difference between slower and faster than
upstream's save.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import math
import threading

import torch
from torch._export.serde import serialize as serde
from torch._export.serde.union import _Union, _UnionTag

_LOCK = threading.RLock()


def _memoized_sym_int(original):
    cache: dict[int, object] = {}

    def serialize_sym_int(s):
        if type(s) is int:
            out = cache.get(s)
            if out is None:
                out = cache[s] = original(s)
            return out
        return original(s)

    return serialize_sym_int


def _memoized_tensor_meta(original):
    cache: dict[tuple, object] = {}

    def serialize_tensor_meta(t: torch.Tensor):
        shape, stride = tuple(t.shape), t.stride()
        if not all(type(x) is int for x in (*shape, *stride)) or type(t.storage_offset()) is not int:
            return original(t)
        key = (shape, tuple(stride), t.storage_offset(), t.dtype, t.device, t.layout, bool(t.requires_grad))
        out = cache.get(key)
        if out is None:
            out = cache[key] = original(t)
        return out

    return serialize_tensor_meta


_FIELDS: dict[type, tuple[str, ...]] = {}


def _field_names(cls) -> tuple[str, ...]:
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def _to_dict_function():
    """torch's `_dataclass_to_dict`, same output, faster (see module doc); shared objects converted once."""
    done: dict[int, tuple[object, object]] = {}  # id -> (object, its dict): the object kept alive with its id
    get = object.__getattribute__

    def to_dict(obj):
        cls = type(obj)
        if cls is int or cls is str or cls is bool or obj is None:
            return obj
        hit = done.get(id(obj))
        if hit is not None and hit[0] is obj:
            return hit[1]
        if isinstance(obj, _Union):
            tag = get(obj, "_type")
            out = {tag: to_dict(get(obj, tag))}
        elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            out = {name: to_dict(get(obj, name)) for name in _field_names(cls)}
        elif isinstance(obj, list):
            return [to_dict(x) for x in obj]
        elif isinstance(obj, tuple):
            return tuple(to_dict(x) for x in obj)
        elif isinstance(obj, dict):
            return {k: to_dict(v) for k, v in obj.items()}
        elif isinstance(obj, float):
            if obj == math.inf:
                return "Infinity"
            if obj == -math.inf:
                return "-Infinity"
            return "NaN" if math.isnan(obj) else obj
        else:
            return obj
        done[id(obj)] = (obj, out)
        return out

    return to_dict


_RESERVED = frozenset(("type", "_type", "create", "value"))
_CHECKED_UNIONS: set[type] = set()


def _union_create(cls, **kwargs):
    """`_Union.create`, same object, without rebuilding the field-name dict per value (module doc)."""
    if len(kwargs) != 1:
        raise AssertionError(f"expected exactly 1 kwarg, got {len(kwargs)}")
    names = _field_names(cls)
    if cls not in _CHECKED_UNIONS:  # torch's __post_init__ check, once per class
        if _RESERVED.intersection(names):
            raise AssertionError("field names 'type', '_type', 'create', 'value' are reserved")
        _CHECKED_UNIONS.add(cls)
    obj = object.__new__(cls)
    state = obj.__dict__
    for name in names:
        state[name] = None
    ((tag, value),) = kwargs.items()
    state[tag] = value
    state["_type"] = _UnionTag.create(tag, cls)
    return obj


def _quiet_print_readable(original, thread: int):
    def print_readable(self, *args, **kwargs):
        if threading.get_ident() == thread and not serde.log.isEnabledFor(logging.DEBUG):
            return ""  # only serialize_graph's debug line asks for it while saving, and it is off
        return original(self, *args, **kwargs)

    return print_readable


@contextlib.contextmanager
def fast_serialization():
    """Within: torch.export's serializer memoizes static tensor metadata and plain ints, builds union
    values and converts its dataclasses to dicts faster, and skips formatting graphs for a debug line
    that is off; the cyclic garbage collector is paused (see module doc)."""
    with _LOCK:
        saved = serde.serialize_tensor_meta, serde.serialize_sym_int, serde._dataclass_to_dict
        saved_create = _Union.__dict__["create"]
        saved_print = torch.fx.GraphModule.print_readable
        serde.serialize_sym_int = _memoized_sym_int(saved[1])
        serde.serialize_tensor_meta = _memoized_tensor_meta(saved[0])
        serde._dataclass_to_dict = _to_dict_function()
        _Union.create = classmethod(_union_create)
        torch.fx.GraphModule.print_readable = _quiet_print_readable(saved_print, threading.get_ident())
        collecting = gc.isenabled()
        gc.disable()
        try:
            yield
        finally:
            serde.serialize_tensor_meta, serde.serialize_sym_int, serde._dataclass_to_dict = saved
            _Union.create = saved_create
            torch.fx.GraphModule.print_readable = saved_print
            if collecting:
                gc.enable()
