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
# Other engines an object can be shown in or exported to, and the package that registers each.
ENGINES = {"etlab": VIEWS_PACKAGE, "model-explorer": "etlab.model_explorer"}

# keyed by class, or by "package.ClassName" for a class of a package the views do not import
_HTML: dict[type | str, Callable[[Any], str]] = {}
_SHOW: dict[type | str, Callable[..., Any]] = {}
_ENGINE_SHOW: dict[str, dict[type | str, Callable[..., Any]]] = {}  # engine -> class -> show
_ENGINE_EXPORT: dict[str, dict[type | str, Callable[..., Any]]] = {}  # engine -> class -> export
_LOCK = threading.Lock()
_loaded = False
_engines_loaded: set[str] = set()


def register(cls: type | str, *, html: Callable[[Any], str] | None = None,
             show: Callable[..., Any] | None = None, export: Callable[..., Any] | None = None,
             engine: str = "etlab") -> None:
    """Use `html(obj)` as the notebook repr and `show(obj, ...)` as the view of instances of `cls`
    (a class, or "package.ClassName": a class of that name defined in that package). With another
    `engine` (a key of ENGINES), `show` / `export(obj, path, ...)` are that engine's."""
    if engine != "etlab":
        if engine not in ENGINES:
            raise ValueError(f"unknown display engine {engine!r}; engines are {sorted(ENGINES)}")
        if show is not None:
            _ENGINE_SHOW.setdefault(engine, {})[cls] = show
        if export is not None:
            _ENGINE_EXPORT.setdefault(engine, {})[cls] = export
        return
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


def show(obj, *args, engine: str = "etlab", **kwargs):
    """The registered view of obj (e.g. the Inspector's dashboard), in `engine` (see ENGINES)."""
    if engine != "etlab":
        return _engine_call(_ENGINE_SHOW, "show", obj, engine, *args, **kwargs)
    fn = _lookup(_SHOW, obj)
    if fn is None:
        raise RuntimeError(f"no view is registered for {type(obj).__name__}: {VIEWS_PACKAGE} is not installed")
    return fn(obj, *args, **kwargs)


def export(obj, *args, engine: str, **kwargs):
    """Writes obj in `engine`'s files (e.g. Model Explorer's graph and node-data JSON)."""
    return _engine_call(_ENGINE_EXPORT, "export", obj, engine, *args, **kwargs)


def _engine_call(tables: dict, what: str, obj, engine: str, *args, **kwargs):
    """Looks obj's class up in `engine`'s table, importing the engine's package by name the first
    time (a plugin lookup, as for the views), and calls what it registered."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; engines are {sorted(ENGINES)}")
    for attempt in range(2):
        table = tables.get(engine, {})
        for cls in type(obj).__mro__:
            for key, fn in table.items():
                if key is cls or (isinstance(key, str) and _named(cls, key)):
                    return fn(obj, *args, **kwargs)
        if attempt or engine in _engines_loaded:
            break
        with _LOCK:
            _engines_loaded.add(engine)
            try:
                importlib.import_module(ENGINES[engine])
            except ImportError as e:
                raise RuntimeError(f"the {engine} engine needs {ENGINES[engine]}, which does not import: {e}") from e
    raise RuntimeError(f"the {engine} engine cannot {what} a {type(obj).__name__}")


def json_ready(value: Any) -> Any:
    """The value with non-finite floats as None (JSON has no NaN: a hostile file's NaN must not stop a
    view) and tuples as lists, for the JSON the views and the Lab server send to the browser."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value
