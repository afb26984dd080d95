"""Every public definition carries a docstring that says what it is for (issue 31: 531 of 1,331 had none).

Public: what a public module (no `_` in its dotted path) exports in `__all__` (without one: the functions and
classes it defines itself), wherever the definition lives, and the public methods and properties those classes
define themselves. A docstring Python makes up does not count (a dataclass's or NamedTuple's `Name(field, ...)`,
an Enum's default). `@overload` stubs are not seen (the implementation's docstring is what help() shows).
"""

from __future__ import annotations

import enum
import importlib
import inspect
import pkgutil
import warnings

import etlab


def _public_modules() -> list[str]:
    names = ["etlab"]
    for info in pkgutil.walk_packages(etlab.__path__, "etlab."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return sorted(names)


def _own_doc(obj) -> str:
    """The docstring obj defines itself, minus the ones Python generates."""
    doc = (obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__) or ""
    doc = doc.strip()
    if inspect.isclass(obj):
        if doc.startswith(obj.__name__ + "("):  # dataclass / NamedTuple / TypedDict signature
            return ""
        if issubclass(obj, enum.Enum) and doc in ("An enumeration.", ""):
            return ""
    return doc


def _members(cls) -> list[tuple[str, object]]:
    """(name, function) of the public methods and properties `cls` defines itself."""
    out = []
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(value, property):
            value = value.fget
        elif isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        elif hasattr(value, "func") and type(value).__name__ == "cached_property":
            value = value.func
        if inspect.isfunction(value):
            out.append((name, value))
    return out


def _definitions() -> dict[str, object]:
    """Qualified public name -> class or function, each definition once (under the first module that shows it)."""
    found: dict[str, object] = {}
    seen: set[int] = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for modname in _public_modules():
            mod = importlib.import_module(modname)
            names = getattr(mod, "__all__", None)
            if names is None:
                names = [n for n, v in vars(mod).items() if not n.startswith("_")
                         and (inspect.isclass(v) or inspect.isfunction(v)) and getattr(v, "__module__", "") == modname]
            for name in names:
                obj = getattr(mod, name)
                if not (inspect.isclass(obj) or inspect.isfunction(obj)) or id(obj) in seen:
                    continue
                if not getattr(obj, "__module__", "").startswith("etlab"):
                    continue  # a re-export of torch's or the standard library's
                seen.add(id(obj))
                found[f"{modname}.{name}"] = obj
                if inspect.isclass(obj):
                    for member, fn in _members(obj):
                        found[f"{modname}.{name}.{member}"] = fn
    return found


def test_public_definitions_have_docstrings():
    defs = _definitions()
    assert len(defs) > 500, "the walk found too few definitions to mean anything"
    missing = sorted(name for name, obj in defs.items() if not _own_doc(obj))
    assert not missing, f"{len(missing)} public definitions without a docstring (say what each is for):\n" + \
        "\n".join(missing)


def test_generated_docstrings_do_not_count():
    from dataclasses import dataclass

    @dataclass
    class Point:
        x: int

    class Kind(enum.Enum):
        A = 1

    assert _own_doc(Point) == "" and _own_doc(Kind) == ""
    assert _own_doc(etlab.schema.program.Program)  # a schema table documented by hand
