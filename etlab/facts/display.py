"""How objects of the lower layers are shown in a notebook, without importing the views.

The Inspector, its event blocks and `DelegationInfo` are analysis objects; their HTML and their
dashboard belong to `etlab.visualizer`, a layer above them, and a lower layer never imports a higher
one. So the views register, per type, an HTML renderer and a "show" function here, and the analysis
objects ask this registry (`html(obj)`, `show(obj, ...)`). When nothing is registered yet, the
package named by `VIEWS_PACKAGE` is imported by name, the way pandas loads its plotting backend: a
plugin lookup, not a dependency, so displaying an Inspector works without importing the views first
and an installation without them still gets a plain repr.
"""

from __future__ import annotations

import importlib
import math
import threading
from collections.abc import Callable
from typing import Any

VIEWS_PACKAGE = "etlab.visualizer"  # registers its renderers when imported

# keyed by class, or by "package.ClassName" for a class of a package the views do not import
_HTML: dict[type | str, Callable[[Any], str]] = {}
_SHOW: dict[type | str, Callable[..., Any]] = {}
_LOCK = threading.Lock()
_loaded = False


def register(cls: type | str, *, html: Callable[[Any], str] | None = None,
             show: Callable[..., Any] | None = None) -> None:
    """Use `html(obj)` as the notebook repr and `show(obj, ...)` as the view of instances of `cls`
    (a class, or "package.ClassName": a class of that name defined in that package)."""
    if html is not None:
        _HTML[cls] = html
    if show is not None:
        _SHOW[cls] = show


def _named(cls: type, key: str) -> bool:
    package, _, name = key.rpartition(".")
    return cls.__name__ == name and (cls.__module__ == package or cls.__module__.startswith(package + "."))


def _lookup(table: dict[type, Callable], obj) -> Callable | None:
    global _loaded
    for attempt in range(2):
        for cls in type(obj).__mro__:
            if cls in table:
                return table[cls]
            for key, fn in table.items():
                if isinstance(key, str) and _named(cls, key):
                    return fn
        if attempt or _loaded:
            return None
        with _LOCK:
            _loaded = True
            try:
                importlib.import_module(VIEWS_PACKAGE)
            except ImportError:
                return None
    return None


def html(obj) -> str | None:
    """The registered HTML repr of obj, or None (then the notebook falls back to repr())."""
    fn = _lookup(_HTML, obj)
    return fn(obj) if fn is not None else None


def show(obj, *args, **kwargs):
    """The registered view of obj (e.g. the Inspector's dashboard)."""
    fn = _lookup(_SHOW, obj)
    if fn is None:
        raise RuntimeError(f"no view is registered for {type(obj).__name__}: {VIEWS_PACKAGE} is not installed")
    return fn(obj, *args, **kwargs)


def json_ready(value):
    """The value with non-finite floats as None (JSON has no NaN: a hostile file's NaN must not stop a
    view) and tuples as lists, for the JSON the views and the Lab server send to the browser."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value
