"""Kernels for operators torch already implements (ATen out-variants and friends), bound from the schema.

Binding happens once per instruction at load time: the KernelCall's value indices are matched
against the operator's schema (types checked, outputs checked not to be constants), every
argument that cannot change is captured, and the call becomes a `functools.partial` of the
cheapest callable for it. That is the public torch function of the same name
(`torch.add(a, b, alpha=1, out=c)`), or the Tensor method for in-place operators, when torch's
argument parser accepts exactly these arguments with their schema keywords (`out=` only parses
for out-variants; checked with tensors that stop the call right after parsing); otherwise the
operator's C++ handle (`OpOverload._op`), which costs about twice as much per call.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import torch

from etlab import ops
from etlab.runtime._errors import ExecutionError, LoadError
from etlab.runtime._kernel_args import checks, load_time_check, runtime_check
from etlab.runtime._registry import KernelEntry, Site, Step
from etlab.runtime._values import TENSOR, ValueTable
from etlab.runtime._view_check import check_view_arguments
from etlab.schema.scalar_type import scalar_type_to_dtype

_PUBLIC_MODULES = (torch._C._VariableFunctions, torch._C._nn, torch._C._special, torch._C._linalg, torch._C._fft)
_MEMORY_FORMATS = (torch.contiguous_format, torch.preserve_format, torch.channels_last, torch.channels_last_3d)
_LAYOUTS = (torch.strided,)  # sparse layouts are refused: their kernels trust indices they are handed

# Schema base type -> EValue kinds accepted for it.
_KINDS = {
    "Tensor": {"Tensor"},
    "List[Tensor]": {"TensorList"},
    "List[Optional[Tensor]]": {"OptionalTensorList", "TensorList"},
    "int": {"Int"}, "SymInt": {"Int"}, "float": {"Double", "Int"}, "bool": {"Bool"}, "str": {"String"},
    "number": {"Int", "Double", "Bool"},
    "List[int]": {"IntList"}, "List[SymInt]": {"IntList"}, "List[float]": {"DoubleList"}, "List[bool]": {"BoolList"},
}


def _base_type(type_str: str) -> tuple[str, bool]:
    if type_str.startswith("Optional[") and type_str.endswith("]"):
        return type_str[len("Optional["):-1], True
    return type_str, False


def _pick(options: tuple, v: int, what: str):
    if not 0 <= v < len(options):
        raise ValueError(f"{what} {v} is not one of 0..{len(options) - 1}")
    return options[v]


def _dtype_argument(v: int) -> torch.dtype:
    dtype = scalar_type_to_dtype(v)
    problem = ops.storage_dtype_problem(dtype)
    if problem is not None:
        raise ValueError(problem)
    return dtype


def _converter(real_type: str) -> Callable[[Any], Any] | None:
    base, _ = _base_type(real_type)
    table = {
        "ScalarType": _dtype_argument,
        "MemoryFormat": lambda v: _pick(_MEMORY_FORMATS, v, "memory format"),
        "Layout": lambda v: _pick(_LAYOUTS, v, "layout (only strided tensors are supported)"),
    }.get(base)
    if table is None:
        return None
    return lambda v: None if v is None else (table(v) if isinstance(v, int) and not isinstance(v, bool) else v)


def _check_arg(param, slot: int, table: ValueTable, site: Site) -> None:
    kind = table.kinds[slot]
    base, optional = _base_type(str(param.type))
    allowed = _KINDS.get(base)
    if allowed is not None and kind not in allowed and not (optional and kind == "Null"):
        raise LoadError(f"{site}: argument {param.name!r} expects {param.type} but value {slot} is a {kind}")
    writes = param.alias_info is not None and param.alias_info.is_write
    if writes:
        targets = table.list_members.get(slot, [slot]) if kind != TENSOR else [slot]
        for t in targets:
            if t in table.constant:
                raise LoadError(f"{site}: argument {param.name!r} writes into value {t}, which is constant data")


class _Parsed(Exception):
    pass


class _ProbeTensor(torch.Tensor):
    """Stops a torch function right after its arguments parsed: nothing is computed or written."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        raise _Parsed


def _probe(value):
    if isinstance(value, torch.Tensor):
        return value.as_subclass(_ProbeTensor)
    if isinstance(value, list):
        return [_probe(v) for v in value]
    return value


def _accepts(fn: Callable, pos: list, kw: dict) -> bool:
    """Does torch's argument parser accept this call of `fn` (keywords included)?"""
    try:
        fn(*[_probe(v) for v in pos], **{k: _probe(v) for k, v in kw.items()})
    except _Parsed:
        return True
    except Exception:  # the signature does not take these arguments
        return False
    return False  # no tensor argument reached the parser's hook: do not trust it


def _fastest_callable(op, pos: list, kw: dict) -> Callable:
    """The public torch function (or Tensor method) of the same name when it takes exactly this
    call, out= included (a keyword the parser only accepts for out-variants); else the op handle."""
    base = op._schema.name.split("::", 1)[1]
    candidates = [getattr(m, base) for m in _PUBLIC_MODULES if hasattr(m, base)]
    if base.endswith("_") and hasattr(torch.Tensor, base):
        candidates.append(getattr(torch.Tensor, base))
    has_out = any(p.kwarg_only and p.alias_info is not None and p.alias_info.is_write for p in op._schema.arguments)
    if has_out or base.endswith("_"):
        for fn in candidates:
            if _accepts(fn, pos, kw):
                return fn
    return op._op


def _bind(op, table: ValueTable, args: list[int], site: Site) -> Step:
    schema = op._schema
    params = schema.arguments
    if len(args) < len(params):
        raise LoadError(f"{site}: {len(args)} arguments given, but {schema} takes {len(params)}")
    pos: list = []
    kw: dict = {}
    pos_slots: list[int] = []
    kw_slots: dict[str, int] = {}
    dynamic: list[tuple[Any, Callable[[], Any]]] = []  # (position or keyword, getter)
    for param, slot in zip(params, args):
        table.check_slot(slot, str(site))
        _check_arg(param, slot, table, site)
        convert = _converter(str(param.real_type))
        get = table.resolver(slot)
        value = table.values[slot]
        if convert is not None:
            value = convert(value)
            if get is not None:
                get = (lambda g, c: lambda: c(g()))(get, convert)
        if get is not None:
            dynamic.append((param.name if param.kwarg_only else len(pos), get))
        if param.kwarg_only:
            kw[param.name] = value
            kw_slots[param.name] = slot
        else:
            pos.append(value)
            pos_slots.append(slot)
    for slot in args[len(params):]:
        table.check_slot(slot, str(site))
    check_view_arguments(schema.name, pos, table, args, site)
    check_args = None
    if checks(schema.name):
        if dynamic:
            check_args = runtime_check(schema, str(site), table, ExecutionError)
        else:
            load_time_check(schema, table, pos, pos_slots, kw, kw_slots, str(site), LoadError)
    result_slot = _result_slot(schema, table, args)
    fn = _fastest_callable(op, pos, kw)
    values = table.values

    if not dynamic and result_slot is None:
        return functools.partial(fn, *pos, **kw)
    if not dynamic:
        call = functools.partial(fn, *pos, **kw)
        return lambda: _store(values, result_slot, call())

    def step():
        for where, get in dynamic:
            if isinstance(where, int):
                pos[where] = get()
            else:
                kw[where] = get()
        if check_args is not None:
            check_args(pos, kw)
        result = fn(*pos, **kw)
        if result_slot is not None:
            _store(values, result_slot, result)

    return step


def _store(values: list, slot: int, result) -> None:
    target = values[slot]
    if isinstance(target, torch.Tensor) and isinstance(result, torch.Tensor):
        if result is not target:
            target.set_(result)  # a functional op's fresh tensor: the slot now aliases it
    else:
        values[slot] = result


def _result_slot(schema, table: ValueTable, args: list[int]) -> int | None:
    """The slot a functional operator's single, non-aliasing return value is stored into."""
    n = len(schema.arguments)
    if len(schema.returns) != 1 or schema.returns[0].alias_info is not None or len(args) <= n:
        return None
    return args[n]


def _resolve(name: str):
    ns, _, rest = name.partition("::")
    base, _, overload = rest.partition(".")
    if not ns or not base:
        return None
    if ns == "quantized_decomposed":
        importlib.import_module("torch.ao.quantization.fx._decomposed")  # registers the namespace
    try:
        return getattr(getattr(getattr(torch.ops, ns), base), overload or "default")
    except (AttributeError, RuntimeError):
        return None


@functools.cache
def torch_kernel(name: str) -> KernelEntry | None:
    """A kernel for any operator torch knows by this name, or None."""
    op = _resolve(name)
    if op is None or not hasattr(op, "_schema"):
        return None
    schema = op._schema
    written = [i for i, p in enumerate(schema.arguments) if p.alias_info is not None and p.alias_info.is_write]
    return KernelEntry(
        name,
        bind=functools.partial(_bind, op),
        result_slot=lambda table, args: _result_slot(schema, table, args),
        origin="torch",
        traced_outputs=lambda table, args: tuple(args[i] for i in written if i < len(args)),
    )
