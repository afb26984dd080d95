"""Holds a value to the contract: `check` walks a TypedDict's fields (and unions, literals, lists, dicts) and raises
ContractError naming where the value is not what the contract says; `fields` and `is_typeddict` are what the
.d.ts generator (_contract_ts.py) walks too."""

from __future__ import annotations

import types
import typing
from typing import Literal, NotRequired, Union

try:
    from etlab.errors import Error as _EtlabError

    _BASES: tuple[type, ...] = (_EtlabError, ValueError)
except ImportError:  # loaded by path by the .d.ts generator (_contract_ts.py), where etlab need not be installed
    _BASES = (ValueError,)


class ContractError(*_BASES):
    """A value that is not what the contract says; the message names where (`view.rows[3].p50`)."""


def _hints(td) -> dict:
    return typing.get_type_hints(td, include_extras=True)


def is_typeddict(tp) -> bool:
    """Whether `tp` is a TypedDict class (what the contract checker and the .d.ts generator walk into)."""
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__required_keys__")


def fields(td) -> list[tuple[str, object, bool]]:
    """A TypedDict's fields in order: (name, type, required)."""
    out = []
    for name, tp in _hints(td).items():
        required = True
        if typing.get_origin(tp) is NotRequired:
            tp, required = typing.get_args(tp)[0], False
        out.append((name, tp, required and name in td.__required_keys__))
    return out


def check(value, tp, where: str = "value") -> None:
    """Raises ContractError unless `value` (parsed JSON, or what will be sent as JSON) is of type `tp`;
    a TypedDict allows no keys it does not name."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is object:
        return
    if tp is type(None) or tp is None:
        if value is not None:
            raise ContractError(f"{where}: expected null, got {type(value).__name__}")
        return
    if origin in (Union, types.UnionType):
        errors = []
        for option in args:
            try:
                check(value, option, where)
                return
            except ContractError as e:
                errors.append(str(e))
        raise ContractError(" / ".join(errors))
    if origin is Literal:
        if value not in args:
            raise ContractError(f"{where}: expected one of {list(args)}, got {value!r}")
        return
    if origin is list:
        if not isinstance(value, list):
            raise ContractError(f"{where}: expected a list, got {type(value).__name__}")
        for i, x in enumerate(value):
            check(x, args[0], f"{where}[{i}]")
        return
    if origin is dict:
        if not isinstance(value, dict):
            raise ContractError(f"{where}: expected an object, got {type(value).__name__}")
        for k, x in value.items():
            check(k, args[0], f"{where} key")
            check(x, args[1], f"{where}[{k!r}]")
        return
    if is_typeddict(tp):
        if not isinstance(value, dict):
            raise ContractError(f"{where}: expected a {tp.__name__} object, got {type(value).__name__}")
        known = fields(tp)
        extra = set(value) - {name for name, _, _ in known}
        if extra:
            raise ContractError(f"{where}: keys the contract ({tp.__name__}) does not name: {sorted(extra)}")
        for name, ftp, required in known:
            if name in value:
                check(value[name], ftp, f"{where}.{name}")
            elif required:
                raise ContractError(f"{where}: no {name!r} ({tp.__name__} requires it)")
        return
    if tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif tp is str:
        ok = isinstance(value, str)
    else:
        raise TypeError(f"{where}: the contract uses a type check() does not know: {tp!r}")
    if not ok:
        raise ContractError(f"{where}: expected {tp.__name__}, got {type(value).__name__} {str(value)[:40]!r}")
