"""Kernel and backend registries, shared by every program loaded in the process.

Operators are named `"aten::add.out"`, `"executorch_prim::et_view.default"` (an empty overload
is written without the dot). This module holds what users register (`register_kernel`,
`register_backend`) and the kernel entry type; the lookup that also consults etlab's own kernel
set is `_lookup.find_kernel`.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from etlab.runtime._values import TENSOR, ValueTable

Step = Callable[[], Any]
_NAME = re.compile(r"^[A-Za-z_][\w]*::[A-Za-z_][\w]*(\.[\w]+)?$")


@dataclass(frozen=True)
class Site:
    """Where an instruction sits, for error messages and trace events."""

    method: str
    chain: int
    instruction: int
    operator: str = ""

    def __str__(self) -> str:
        op = f" ({self.operator})" if self.operator else ""
        return f"method {self.method!r}, chain {self.chain}, instruction {self.instruction}{op}"


@dataclass
class KernelEntry:
    """How to turn one KernelCall into a zero-argument step.

    `bind(table, args, site)` runs once at load time; `result_slot(table, args)` names the slot
    the kernel stores a Python value into when it runs (None if it only writes tensors in place).
    """

    name: str
    bind: Callable[[ValueTable, list[int], Site], Step]
    result_slot: Callable[[ValueTable, list[int]], int | None]
    origin: str  # "custom", "builtin" or "torch"
    # Slots whose tensor the kernel re-points at other memory (views), if any.
    rebinds: Callable[[ValueTable, list[int]], list[int]] | None = None
    # The output slots an ETDump logs after the call (upstream logs a kernel's out arguments), or
    # None for the runtime's primitive operators, which upstream traces with OPERATOR_CALL only.
    traced_outputs: Callable[[ValueTable, list[int]], tuple[int, ...]] | None = None


_LOCK = threading.Lock()
_CUSTOM: dict[str, KernelEntry] = {}
_BACKENDS: dict[str, Any] = {}


def operator_key(name: str, overload: str | None) -> str:
    """The registry key of an operator: 'name.overload', or the name alone."""
    return f"{name}.{overload}" if overload else name


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"operator name {name!r} is not of the form 'namespace::name' or 'namespace::name.overload'")


def _scalar_result_slot(table: ValueTable, args: list[int]) -> int | None:
    return args[-1] if args and table.kinds[args[-1]] != TENSOR else None


def _no_result_slot(table: ValueTable, args: list[int]) -> None:
    return None


def _last_slot(table: ValueTable, args: list[int]) -> tuple[int, ...]:
    return tuple(args[-1:])


def python_kernel(name: str, fn: Callable[..., Any], origin: str = "custom", *, stores_result: bool = True
                  ) -> KernelEntry:
    """Wraps `fn(*args)` as a kernel: it gets every argument of the call (inputs, then outputs,
    then the return slot) resolved to tensors and Python values, writes output tensors in place,
    and (if `stores_result`) may return a non-tensor result, stored in the last argument's slot."""
    result_slot = _scalar_result_slot if stores_result else _no_result_slot

    def bind(table: ValueTable, args: list[int], site: Site) -> Step:
        for a in args:
            table.check_slot(a, str(site))
        values = table.values
        static = [values[a] for a in args]
        dynamic = [(i, r) for i, a in enumerate(args) if (r := table.resolver(a)) is not None]
        slot = result_slot(table, args)
        if not dynamic and slot is None:
            def call_static() -> None:  # returns nothing: only a jump step may name the next step (Goto)
                fn(*static)

            return call_static
        call = list(static)

        def step():
            for i, get in dynamic:
                call[i] = get()
            result = fn(*call)
            if slot is not None and result is not None:
                values[slot] = result

        return step

    return KernelEntry(name, bind, result_slot, origin, traced_outputs=_last_slot)


def register_kernel(name: str, fn: Callable[..., Any] | None = None):
    """Registers `fn` as the kernel of operator `name`; usable as a decorator.

    `fn(*args)` receives the KernelCall's arguments in order (inputs, outputs, return slot) as
    tensors and Python values. It writes output tensors in place; a non-None, non-tensor return
    value is stored in the last argument's slot (how symbolic-size kernels hand back ints).
    Registering a name again replaces the previous kernel for programs loaded afterwards.
    """
    _check_name(name)

    def deco(f):
        if not callable(f):
            raise TypeError(f"kernel for {name!r} must be callable, got {type(f).__name__}")
        with _LOCK:
            _CUSTOM[name] = python_kernel(name, f)
        return f

    return deco(fn) if fn is not None else deco


def unregister_kernel(name: str) -> None:
    """Removes a kernel `register_kernel` added (programs loaded before keep it); an unknown name is ignored."""
    with _LOCK:
        _CUSTOM.pop(name, None)


def registered_kernel(name: str) -> KernelEntry | None:
    """The kernel registered for `name` with register_kernel, or None."""
    with _LOCK:
        return _CUSTOM.get(name)


def registered_kernel_names() -> set[str]:
    """The operators with a custom kernel registered in this process."""
    with _LOCK:
        return set(_CUSTOM)


def register_backend(name: str, backend: Any) -> None:
    """Makes `backend` run the delegates whose id is `name`.

    `backend.init(processed: memoryview, compile_specs: list[tuple[str, bytes]]) -> handle` runs
    once per delegate when a method loads; `backend.execute(handle, args, context)` runs each
    DelegateCall (args: the call's values in order, inputs then outputs; outputs are written in
    place); optional `destroy(handle)` runs when the method is released; optional
    `is_available() -> bool` (default True). A backend with `takes_init_context = True` gets a
    third argument, a `BackendInitContext` (the program's named data, where XNNPACK keeps weights).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"backend name must be a non-empty string, got {name!r}")
    for attr in ("init", "execute"):
        if not callable(getattr(backend, attr, None)):
            raise TypeError(f"backend {name!r} has no callable {attr}()")
    with _LOCK:
        _BACKENDS[name] = backend


def unregister_backend(name: str) -> None:
    """Removes a backend `register_backend` added; an unknown name is ignored."""
    with _LOCK:
        _BACKENDS.pop(name, None)


def find_backend(name: str) -> Any | None:
    """The backend registered under `name`, or None."""
    with _LOCK:
        return _BACKENDS.get(name)


def backend_available(backend: Any) -> bool:
    """Whether a backend says it can run here (its `is_available()`, true when it has none)."""
    check = getattr(backend, "is_available", None)
    return bool(check()) if callable(check) else True


class BackendRegistry:
    """The registered delegate backends (`registered_backend_names`, `is_available(name)`)."""

    @property
    def registered_backend_names(self) -> list[str]:
        """The ids of the registered delegate backends, sorted."""
        with _LOCK:
            return sorted(_BACKENDS)

    def is_available(self, name: str) -> bool:
        """Whether a backend of that id is registered and says it can run here (its optional is_available())."""
        backend = find_backend(name)
        return backend is not None and backend_available(backend)
